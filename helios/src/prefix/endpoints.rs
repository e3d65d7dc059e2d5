//! Token endpoints of a rendered prompt: the design's exact-cut rule.
//!
//! The renderer records byte marks where complete messages end; the full
//! prompt is encoded once, with each token's byte span (the `tokenizers`
//! crate's `Encoding::get_offsets` from `Tokenizer::encode`, untrimmed: a
//! byte-level pre-tokenizer must keep `trim_offsets = false`, or a token
//! whose leading space lies before a mark would look as if it started at the
//! mark). The design's rule:
//!
//! - "An exact cut requires every preceding token to end at or before it and
//!   every following token to start at or after it." A BPE token crossing a
//!   mark cancels that endpoint: it is never moved to a nearby boundary, and
//!   overlapping Unicode spans (byte-fallback pieces of one character) can
//!   never produce a partial-token cut;
//! - "Continuation truncation excludes later positions": marks past the end
//!   of the (possibly truncated) prompt text are dropped;
//! - "Token endpoints are sorted, deduplicated, and strictly inside the
//!   prompt": the full prompt is its own endpoint ([`PromptEndpoints::prompt`]).
//!
//! Only consumed history defines a checkpoint: the terminal endpoint of a
//! request excludes the sampled token it has not consumed
//! ([`terminal_endpoint`]).

use thiserror::Error;

/// Why marks and offsets cannot be mapped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    /// A token's byte span is reversed or leaves the prompt text.
    #[error("offsets[{token}] = ({start}, {end}) is not a span of the {text_len}-byte prompt")]
    TokenSpan {
        /// Index of the token.
        token: usize,
        /// Start byte.
        start: usize,
        /// End byte.
        end: usize,
        /// Bytes in the prompt text.
        text_len: usize,
    },
    /// A mark falls inside a UTF-8 character: the renderer's marks are
    /// byte offsets of message ends, always on character boundaries.
    #[error("mark {mark} is inside a character of the prompt text")]
    MarkInsideCharacter {
        /// The mark.
        mark: usize,
    },
    /// The prompt holds more tokens than a `u32` counts.
    #[error("the prompt holds {tokens} tokens, more than a u32 counts")]
    TooManyTokens {
        /// Tokens in the prompt.
        tokens: usize,
    },
}

/// The endpoints a prompt offers to checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptEndpoints {
    /// Exact message endpoints, sorted, unique, each in `1..prompt`.
    pub messages: Vec<u32>,
    /// The final prompt endpoint: the number of prompt tokens.
    pub prompt: u32,
}

/// Maps the renderer's message-end `marks` (byte offsets into `text`)
/// through the prompt's token `offsets` (one byte span per token, in order)
/// with the exact-cut rule.
pub fn prompt_endpoints(
    text: &str,
    marks: &[usize],
    offsets: &[(usize, usize)],
) -> Result<PromptEndpoints, EndpointError> {
    let prompt = u32::try_from(offsets.len()).map_err(|_| EndpointError::TooManyTokens {
        tokens: offsets.len(),
    })?;
    for (token, &(start, end)) in offsets.iter().enumerate() {
        if start > end || end > text.len() {
            return Err(EndpointError::TokenSpan {
                token,
                start,
                end,
                text_len: text.len(),
            });
        }
    }
    // ends[k]: the furthest end among tokens [0, k); starts[k]: the earliest
    // start among tokens [k, n). Both are nondecreasing in k.
    let ends: Vec<usize> = std::iter::once(0)
        .chain(offsets.iter().scan(0, |furthest, &(_, end)| {
            *furthest = end.max(*furthest);
            Some(*furthest)
        }))
        .collect();
    let mut starts = vec![usize::MAX; offsets.len() + 1];
    for (k, &(start, _)) in offsets.iter().enumerate().rev() {
        starts[k] = start.min(starts[k + 1]);
    }
    let mut messages = Vec::new();
    for &mark in marks {
        if mark > text.len() {
            continue;
        }
        if !text.is_char_boundary(mark) {
            return Err(EndpointError::MarkInsideCharacter { mark });
        }
        // The last k whose preceding tokens all end by the mark; the cut is
        // exact when the following tokens all start at or after it. No
        // smaller k can do better: `starts` is nondecreasing.
        let k = ends.partition_point(|&end| end <= mark) - 1;
        if starts[k] >= mark && k > 0 && k < offsets.len() {
            messages.push(u32::try_from(k).expect("k < prompt, a u32"));
        }
    }
    messages.sort_unstable();
    messages.dedup();
    Ok(PromptEndpoints { messages, prompt })
}

/// The terminal consumed prefix of a request whose history (prompt, then
/// output) holds `known` tokens, the last of which is a sampled token not
/// yet consumed when `pending` is set. A request that ends after one output
/// token therefore shares its prompt endpoint.
///
/// # Panics
/// When `pending` is set and `known` is 0.
pub fn terminal_endpoint(known: u32, pending: bool) -> u32 {
    known
        .checked_sub(u32::from(pending))
        .expect("a pending token is part of the known history")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_between_tokens_is_an_endpoint() {
        let text = "ab|cd|";
        let offsets = [(0, 2), (2, 3), (3, 5), (5, 6)];
        let endpoints = prompt_endpoints(text, &[3, 6], &offsets).unwrap();
        // 3 cuts after the second token; 6 is the prompt end, not a message.
        assert_eq!(endpoints.messages, vec![2]);
        assert_eq!(endpoints.prompt, 4);
    }

    #[test]
    fn a_token_crossing_a_mark_cancels_it() {
        let text = "ab\n\ncd";
        // "\n\n" merged across the mark at 3.
        let offsets = [(0, 2), (2, 4), (4, 6)];
        let endpoints = prompt_endpoints(text, &[3, 4], &offsets).unwrap();
        assert_eq!(endpoints.messages, vec![2]);
    }

    #[test]
    fn marks_past_a_truncated_prompt_are_dropped() {
        let offsets = [(0, 1), (1, 2)];
        let endpoints = prompt_endpoints("ab", &[1, 5, 9], &offsets).unwrap();
        assert_eq!(endpoints.messages, vec![1]);
    }

    #[test]
    fn invalid_spans_and_marks_are_rejected() {
        assert!(matches!(
            prompt_endpoints("ab", &[], &[(0, 3)]),
            Err(EndpointError::TokenSpan { token: 0, .. })
        ));
        assert!(matches!(
            prompt_endpoints("ab", &[], &[(2, 1)]),
            Err(EndpointError::TokenSpan { token: 0, .. })
        ));
        assert_eq!(
            prompt_endpoints("é", &[1], &[(0, 2)]),
            Err(EndpointError::MarkInsideCharacter { mark: 1 })
        );
    }

    #[test]
    fn terminal_endpoints_exclude_the_pending_token() {
        assert_eq!(terminal_endpoint(10, true), 9);
        assert_eq!(terminal_endpoint(10, false), 10);
        // One output token: the terminal endpoint is the prompt endpoint.
        let prompt = 7;
        assert_eq!(terminal_endpoint(prompt + 1, true), prompt);
    }
}
