//! Finding markers in text that arrives in pieces.

/// The earliest occurrence in `text` of any of `markers` (ties: the longer
/// marker): its byte position, its key, and its length.
pub(super) fn earliest<K: Copy>(text: &str, markers: &[(&str, K)]) -> Option<(usize, K, usize)> {
    markers
        .iter()
        .filter_map(|&(marker, key)| Some((text.find(marker)?, usize::MAX - marker.len(), key)))
        .min_by_key(|&(position, order, _)| (position, order))
        .map(|(position, order, key)| (position, key, usize::MAX - order))
}

/// Where the longest suffix of `text` that is a proper prefix of one of
/// `markers` begins (`text.len()` when there is none): text from there on
/// may still become a marker and must be held back.
pub(super) fn partial_start(text: &str, markers: &[&str]) -> usize {
    text.char_indices()
        .map(|(start, _)| start)
        .find(|&start| {
            let suffix = &text[start..];
            (markers.iter()).any(|marker| marker.len() > suffix.len() && marker.starts_with(suffix))
        })
        .unwrap_or(text.len())
}

/// `text` split before its trailing white space.
pub(super) fn split_trailing_space(text: &str) -> (&str, &str) {
    let body = text.trim_end();
    (body, &text[body.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_marker_wins_then_the_longest() {
        let markers = [("<a>", 1), ("<ab>", 2), ("x", 3)];
        assert_eq!(earliest("zz<ab>x", &markers), Some((2, 2, 4)));
        assert_eq!(earliest("x<a>", &markers), Some((0, 3, 1)));
        assert_eq!(earliest("none", &markers), None);
    }

    #[test]
    fn a_suffix_that_may_begin_a_marker_is_held() {
        assert_eq!(partial_start("text <to", &["<tool>"]), 5);
        assert_eq!(partial_start("text <tool>", &["<tool>"]), 11);
        assert_eq!(partial_start("a<", &["<x>", "<<y"]), 1);
        assert_eq!(partial_start("é<", &["<x>"]), 2);
        assert_eq!(split_trailing_space("a b \n"), ("a b", " \n"));
    }
}
