//! Which parts of the window the loader backs with device memory.
//!
//! Each region's `backed_bytes` from its start are backed, widened to whole
//! granules (regions are laid out at buffer alignment, not granule
//! alignment), clipped to the reservation and merged where they touch or
//! overlap, so every granule is mapped once.

use super::error::ReplayError;
use crate::core::proto::Window;
use crate::core::ValidCore;
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
        self.spans.iter().map(|span| span.len).sum()
    }
}

/// Plans the reservation and the backed spans of `window` for allocation
/// granularity `granularity`.
pub fn plan_spans(window: &Window, granularity: u64) -> Result<SpanPlan, ReplayError> {
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
    let mut wanted = Vec::with_capacity(window.regions.len());
    for region in &window.regions {
        if region.backed_bytes == 0 {
            continue;
        }
        let start = region.offset - region.offset % granularity;
        let end = region
            .offset
            .checked_add(region.backed_bytes)
            .and_then(|end| end.checked_next_multiple_of(granularity))
            .ok_or_else(overflow)?
            .min(reservation);
        if start < end {
            wanted.push((start, end));
        }
    }
    wanted.sort_unstable();
    let mut spans: Vec<Span> = Vec::with_capacity(wanted.len());
    for (start, end) in wanted {
        match spans.last_mut() {
            Some(last) if start <= last.end() => {
                last.len = last.len.max(end - last.offset);
            }
            _ => spans.push(Span {
                offset: start,
                len: end - start,
            }),
        }
    }
    Ok(SpanPlan { reservation, spans })
}

/// Checks that every buffer the host touches (initial contents, the
/// qualification's writes and digests) lies in backed memory.
pub fn check_backed(core: &ValidCore, spans: &[Span]) -> Result<(), ReplayError> {
    let steps = core
        .qualification()
        .map(|q| q.steps.as_slice())
        .unwrap_or(&[]);
    let qualified = steps.iter().flat_map(|step| {
        (step.writes.iter().map(|write| write.buffer.as_str()))
            .chain(step.digests.iter().map(|digest| digest.buffer.as_str()))
    });
    let touched = (core.buffers().iter())
        .filter(|buffer| !buffer.initial_tensor.is_empty())
        .map(|buffer| buffer.name.as_str())
        .chain(qualified);
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
    fn a_granularity_the_base_does_not_meet_is_refused() {
        let err = plan_spans(&window(Vec::new()), 3 << 20).unwrap_err();
        assert!(matches!(err, ReplayError::WindowLayout { .. }));
        let err = plan_spans(&window(Vec::new()), 0).unwrap_err();
        assert!(matches!(err, ReplayError::WindowLayout { .. }));
    }
}
