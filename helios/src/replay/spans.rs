//! Which parts of the window the loader backs with device memory.
//!
//! Each region's `backed_bytes` from its start are backed, widened to whole
//! granules (regions are laid out at buffer alignment, not granule
//! alignment), clipped to the reservation and merged where they touch or
//! overlap, so every granule is mapped once. The KV page region may instead
//! be backed page by page (`super::kv_backing`), after the others.

use super::error::ReplayError;
use crate::core::proto::{Region, Window};
use crate::core::RankView;
use crate::cuda::{covered, Span};

/// The reservation and the spans to back, for one device's granularity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanPlan {
    /// Bytes to reserve: the window's size rounded up to the granularity.
    pub reservation: u64,
    /// Spans to map, sorted by offset, disjoint and not touching.
    pub spans: Vec<Span>,
}

impl SpanPlan {
    /// Bytes the spans back.
    pub fn backed_bytes(&self) -> u64 {
        span_bytes(&self.spans)
    }
}

/// Plans the reservation and the backed spans of `window` for allocation
/// granularity `granularity`.
pub fn plan_spans(window: &Window, granularity: u64) -> Result<SpanPlan, ReplayError> {
    plan_spans_of(window, granularity, |_| true)
}

/// [`plan_spans`] for the regions `keep` accepts only; the reservation is
/// the whole window's.
pub fn plan_spans_of(
    window: &Window,
    granularity: u64,
    keep: impl Fn(&Region) -> bool,
) -> Result<SpanPlan, ReplayError> {
    let layout = |reason| ReplayError::WindowLayout { reason };
    if granularity == 0 {
        return Err(layout("the device reports an allocation granularity of 0"));
    }
    if !window.base.is_multiple_of(granularity) {
        return Err(layout(
            "the base is not a multiple of the device's allocation granularity",
        ));
    }
    let overflow = || layout("the window overflows the address space when rounded to granules");
    let reservation = window
        .size
        .checked_next_multiple_of(granularity)
        .filter(|&size| window.base.checked_add(size).is_some())
        .ok_or_else(overflow)?;
    let kept = window.regions.iter().filter(|region| keep(region));
    let ranges = kept.map(|region| {
        (
            region.offset,
            region.offset.saturating_add(region.backed_bytes),
        )
    });
    let spans = granule_spans(ranges, granularity, reservation).ok_or_else(overflow)?;
    Ok(SpanPlan { reservation, spans })
}

/// The granules that hold the byte ranges `[start, end)`: each range widened
/// to whole granules and clipped to `reservation`, then sorted and merged
/// where they touch or overlap. `None` when a range's end cannot be rounded
/// up (it overflows the address space); `granularity` must not be 0.
pub(super) fn granule_spans(
    ranges: impl Iterator<Item = (u64, u64)>,
    granularity: u64,
    reservation: u64,
) -> Option<Vec<Span>> {
    let mut wanted = Vec::new();
    for (start, end) in ranges {
        if start >= end {
            continue;
        }
        let start = start - start % granularity;
        let end = end.checked_next_multiple_of(granularity)?.min(reservation);
        if start < end {
            wanted.push((start, end));
        }
    }
    let wanted = wanted.into_iter().map(|(start, end)| Span {
        offset: start,
        len: end - start,
    });
    Some(merged(wanted.collect()))
}

/// `spans` sorted, with spans that touch or overlap merged into one.
pub(super) fn merged(mut spans: Vec<Span>) -> Vec<Span> {
    spans.sort_unstable();
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for span in spans {
        match out.last_mut() {
            Some(last) if span.offset <= last.end() => {
                last.len = last.len.max(span.end() - last.offset);
            }
            _ => out.push(span),
        }
    }
    out
}

/// The parts of `spans` that `mapped` does not cover. Both are sorted by
/// offset and disjoint; the result is too.
pub(super) fn subtract(spans: &[Span], mapped: &[Span]) -> Vec<Span> {
    let mut out = Vec::with_capacity(spans.len());
    for span in spans {
        let mut cursor = span.offset;
        let end = span.end();
        for taken in mapped {
            if taken.end() <= cursor || taken.offset >= end {
                continue;
            }
            if taken.offset > cursor {
                out.push(Span {
                    offset: cursor,
                    len: taken.offset - cursor,
                });
            }
            cursor = cursor.max(taken.end());
        }
        if cursor < end {
            out.push(Span {
                offset: cursor,
                len: end - cursor,
            });
        }
    }
    out
}

/// Bytes `spans` cover (disjoint spans).
pub(super) fn span_bytes(spans: &[Span]) -> u64 {
    spans.iter().map(|span| span.len).sum()
}

/// Checks that every buffer the host touches (initial contents, the
/// qualification's writes and digests) lies in backed memory.
pub fn check_backed(core: RankView<'_>, spans: &[Span]) -> Result<(), ReplayError> {
    check_initial_backed(core, spans)?;
    check_qualification_backed(core, spans)
}

/// Checks that every buffer with initial contents lies in backed memory.
pub fn check_initial_backed(core: RankView<'_>, spans: &[Span]) -> Result<(), ReplayError> {
    let initial = (core.buffers().iter())
        .filter(|buffer| !buffer.initial_tensor.is_empty())
        .map(|buffer| buffer.name.as_str());
    check_named(core, spans, initial)
}

/// Checks that every buffer the qualification writes or digests lies in
/// backed memory: with fewer KV pages backed than prepared, the KV pages
/// buffer does not.
pub fn check_qualification_backed(core: RankView<'_>, spans: &[Span]) -> Result<(), ReplayError> {
    let steps = core
        .qualification()
        .map(|q| q.steps.as_slice())
        .unwrap_or(&[]);
    let qualified = steps.iter().flat_map(|step| {
        (step.writes.iter().map(|write| write.buffer.as_str()))
            .chain(step.digests.iter().map(|digest| digest.buffer.as_str()))
    });
    check_named(core, spans, qualified)
}

fn check_named<'a>(
    core: RankView<'_>,
    spans: &[Span],
    touched: impl Iterator<Item = &'a str>,
) -> Result<(), ReplayError> {
    for name in touched {
        let Some(buffer) = core.buffer_named(name) else {
            continue; // validation guarantees it exists
        };
        if !covered(spans, buffer.offset, buffer.size_bytes) {
            return Err(ReplayError::Unbacked {
                buffer: name.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proto::{Region, RegionKind};

    const G: u64 = 2 << 20;

    fn region(offset: u64, size: u64, backed_bytes: u64) -> Region {
        Region {
            kind: RegionKind::Scratch as i32,
            offset,
            size,
            backed_bytes,
        }
    }

    fn window(regions: Vec<Region>) -> Window {
        Window {
            base: 0x2000_0000_0000,
            size: 32 << 20,
            regions,
        }
    }

    fn span(offset: u64, len: u64) -> Span {
        Span { offset, len }
    }

    #[test]
    fn aligned_regions_back_their_backed_bytes() {
        let plan = plan_spans(
            &window(vec![region(0, 4 * G, 2 * G), region(8 * G, 4 * G, 4 * G)]),
            G,
        )
        .unwrap();
        assert_eq!(plan.reservation, 32 << 20);
        assert_eq!(plan.spans, vec![span(0, 2 * G), span(8 * G, 4 * G)]);
        assert_eq!(plan.backed_bytes(), 6 * G);
    }

    #[test]
    fn unaligned_regions_widen_to_whole_granules() {
        let plan = plan_spans(&window(vec![region(G + 256, 1000, 1000)]), G).unwrap();
        assert_eq!(plan.spans, vec![span(G, G)]);
    }

    #[test]
    fn regions_sharing_a_granule_merge() {
        let plan = plan_spans(
            &window(vec![region(G + 4096, 4096, 4096), region(256, G, G)]),
            G,
        )
        .unwrap();
        assert_eq!(plan.spans, vec![span(0, 2 * G)]);
    }

    #[test]
    fn touching_spans_merge() {
        let plan = plan_spans(&window(vec![region(0, G, G), region(G, G, G)]), G).unwrap();
        assert_eq!(plan.spans, vec![span(0, 2 * G)]);
    }

    #[test]
    fn a_span_inside_another_keeps_the_larger() {
        let plan = plan_spans(&window(vec![region(0, 4 * G, 4 * G), region(G, G, G)]), G).unwrap();
        assert_eq!(plan.spans, vec![span(0, 4 * G)]);
    }

    #[test]
    fn unbacked_regions_are_skipped() {
        let plan = plan_spans(&window(vec![region(0, 4 * G, 0)]), G).unwrap();
        assert!(plan.spans.is_empty());
    }

    #[test]
    fn the_reservation_rounds_up_and_clips_the_last_span() {
        let mut w = window(vec![region(0, (32 << 20) + 100, (32 << 20) + 100)]);
        w.size = (32 << 20) + 100;
        let plan = plan_spans(&w, G).unwrap();
        assert_eq!(plan.reservation, 34 << 20);
        assert_eq!(plan.spans, vec![span(0, 34 << 20)]);
    }

    #[test]
    fn a_filtered_plan_keeps_the_whole_reservation() {
        let regions = vec![region(0, 4 * G, 4 * G), region(8 * G, 4 * G, 4 * G)];
        let plan = plan_spans_of(&window(regions), G, |r| r.offset != 0).unwrap();
        assert_eq!(plan.reservation, 32 << 20);
        assert_eq!(plan.spans, vec![span(8 * G, 4 * G)]);
    }

    #[test]
    fn subtracting_leaves_the_unmapped_parts() {
        let spans = [span(0, 4 * G), span(6 * G, 2 * G)];
        let mapped = [span(G, G), span(3 * G, 4 * G)];
        assert_eq!(
            subtract(&spans, &mapped),
            vec![span(0, G), span(2 * G, G), span(7 * G, G)]
        );
        assert_eq!(subtract(&spans, &[]), spans.to_vec());
        assert!(subtract(&spans, &[span(0, 8 * G)]).is_empty());
    }

    #[test]
    fn a_qualification_over_unbacked_kv_pages_is_refused_when_it_runs() {
        use crate::core::proto::BufferDigest;
        use crate::core::ValidCore;
        let mut core = crate::core::sample::tiny_core();
        let kv = core.buffers.iter().find(|b| b.name == "kv.pages").unwrap();
        let kv_end = kv.offset + kv.size_bytes;
        core.qualification.as_mut().unwrap().steps[0]
            .digests
            .push(BufferDigest {
                buffer: "kv.pages".to_owned(),
                sha256: "0".repeat(64),
            });
        let core = ValidCore::new(core).unwrap();
        let everything = [span(0, 32 << 20)];
        check_qualification_backed(core.view(), &everything).unwrap();
        // The KV region backed up to the buffer's last page only.
        let short = [span(0, kv_end - 1), span(kv_end, (32 << 20) - kv_end)];
        check_initial_backed(core.view(), &short).unwrap();
        let err = check_qualification_backed(core.view(), &short).unwrap_err();
        assert!(matches!(err, ReplayError::Unbacked { ref buffer } if buffer == "kv.pages"));
    }

    #[test]
    fn a_granularity_the_base_does_not_meet_is_refused() {
        let err = plan_spans(&window(Vec::new()), 3 << 20).unwrap_err();
        assert!(matches!(err, ReplayError::WindowLayout { .. }));
        let err = plan_spans(&window(Vec::new()), 0).unwrap_err();
        assert!(matches!(err, ReplayError::WindowLayout { .. }));
    }
}
