//! How many KV pages a load backs with device memory, and where.
//!
//! The KV page region is reserved at its prepared extent, and the graphs were
//! captured with the KV pages buffer at its prepared shape, so a load can
//! never use more pages than prepared. It can back fewer: with the contract's
//! `kv_page_axis` ([`KvLayout`]) pages `[0, n)` of every slab are backed and
//! the host hands out pages below `n` only. The loader backs every other
//! region and uploads the graphs first, then measures free memory and backs
//! as many pages as fit while a configured reserve plus [`DRIVER_MARGIN`]
//! stay free.

use super::error::ReplayError;
use super::spans::{granule_spans, span_bytes, subtract};
use crate::core::proto::{PreparedContract, RegionKind};
use crate::core::{KvLayout, RankView};
use crate::cuda::Span;

/// Device memory always left free after the KV pages are backed, for the
/// driver's own allocations (context growth, launches, library workspaces).
pub const DRIVER_MARGIN: u64 = 64 << 20;

/// How much of the KV page region a load backs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvBacking {
    /// The extent preparation backed: every prepared page. The
    /// qualification's digests cover the whole KV pages buffer, so checking
    /// and fault isolation need this. Refused when it does not fit.
    #[default]
    Prepared,
    /// As many pages as free memory holds once everything else is loaded,
    /// leaving `reserve_bytes` plus [`DRIVER_MARGIN`] free; at most the
    /// prepared pages, at least what one request of the context limit needs.
    /// A core without `kv_page_axis` backs every prepared page or nothing.
    FromFreeMemory {
        /// Device memory to leave free besides the driver margin.
        reserve_bytes: u64,
    },
}

/// The window as the KV planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct KvWindow<'a> {
    /// The device's allocation granularity.
    pub granularity: u64,
    /// Bytes reserved; spans are clipped to it.
    pub reservation: u64,
    /// Spans already mapped, sorted by offset and disjoint.
    pub mapped: &'a [Span],
}

impl KvWindow<'_> {
    /// The granules holding `ranges` that are not mapped yet.
    fn unmapped(&self, ranges: impl Iterator<Item = (u64, u64)>) -> Result<Vec<Span>, ReplayError> {
        let spans = granule_spans(ranges, self.granularity, self.reservation).ok_or(
            ReplayError::WindowLayout {
                reason: "a KV page span overflows the address space when rounded to granules",
            },
        )?;
        Ok(subtract(&spans, self.mapped))
    }
}

/// The KV pages a load backs and the spans still to map for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPlan {
    /// Pages backed in every slab, the null page included.
    pub pages: u32,
    /// Spans to map: sorted, disjoint, none of them mapped already.
    pub spans: Vec<Span>,
}

impl KvPlan {
    /// Bytes the spans to map add.
    pub fn mapped_bytes(&self) -> u64 {
        span_bytes(&self.spans)
    }
}

/// Pages one request of the context limit needs, the null page included
/// (`page_size` is validated non-zero; 0 counts as 1 rather than panic).
pub fn min_kv_pages(contract: &PreparedContract) -> u32 {
    let per_request = contract.context_limit.div_ceil(contract.page_size.max(1));
    per_request.saturating_add(1)
}

/// Free device memory the KV pages may use: `free` less the reserve and
/// [`DRIVER_MARGIN`].
pub fn kv_budget(free: u64, reserve_bytes: u64) -> u64 {
    free.saturating_sub(reserve_bytes)
        .saturating_sub(DRIVER_MARGIN)
}

/// The granules of the KV page regions' recorded extent (as preparation
/// backed them) that are not mapped yet.
fn prepared_spans(core: RankView<'_>, window: KvWindow<'_>) -> Result<Vec<Span>, ReplayError> {
    let kv = (core.window().regions.iter())
        .filter(|region| region.kind == RegionKind::KvPages as i32)
        .map(|region| {
            (
                region.offset,
                region.offset.saturating_add(region.backed_bytes),
            )
        });
    window.unmapped(kv)
}

/// [`KvBacking::Prepared`]: every prepared page.
pub fn plan_kv_prepared(core: RankView<'_>, window: KvWindow<'_>) -> Result<KvPlan, ReplayError> {
    Ok(KvPlan {
        pages: core.contract().kv_pages,
        spans: prepared_spans(core, window)?,
    })
}

/// The granules holding pages `[0, pages)` of every slab that are not
/// mapped yet.
pub fn page_spans(
    layout: &KvLayout,
    pages: u32,
    window: KvWindow<'_>,
) -> Result<Vec<Span>, ReplayError> {
    window.unmapped(layout.page_ranges(pages))
}

/// [`KvBacking::FromFreeMemory`]: the most pages whose unmapped granules fit
/// in [`kv_budget`]`(free, reserve_bytes)`, at most the prepared ones.
///
/// The pages' granules, not `pages * bytes_per_page`, are what the budget
/// must hold: every slab's last page rounds up to a whole granule, which for
/// a few hundred slabs is hundreds of MiB.
pub fn plan_kv_from_free(
    core: RankView<'_>,
    window: KvWindow<'_>,
    free: u64,
    reserve_bytes: u64,
) -> Result<KvPlan, ReplayError> {
    plan_kv_within(core, window, kv_budget(free, reserve_bytes))
}

/// The most pages whose unmapped granules fit in `budget` bytes, at most the
/// prepared ones and at least what one request of the context limit needs
/// ([`plan_kv_from_free`] with the budget given: a rank sharing its device
/// with other ranks takes its share of [`kv_budget`]).
pub fn plan_kv_within(
    core: RankView<'_>,
    window: KvWindow<'_>,
    budget: u64,
) -> Result<KvPlan, ReplayError> {
    let contract = core.contract();
    let short = |needed, backable| ReplayError::InsufficientKvPages {
        needed,
        backable,
        bytes_per_page: contract.bytes_per_page,
        budget,
    };
    let Some(layout) = core.kv_layout() else {
        // Without the page axis only the whole prepared extent can be backed.
        let spans = prepared_spans(core, window)?;
        if span_bytes(&spans) > budget {
            return Err(short(contract.kv_pages, 0));
        }
        return Ok(KvPlan {
            pages: contract.kv_pages,
            spans,
        });
    };
    // Granules other regions already mapped cost nothing, so the cost is not
    // `pages * bytes_per_page`; it does grow with the pages.
    let cost = |pages| page_spans(layout, pages, window).map(|spans| span_bytes(&spans));
    // The answer lies in [low, high]: 0 pages cost nothing, and more than
    // the prepared pages are never backed.
    let (mut low, mut high) = (0, contract.kv_pages);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if cost(mid)? <= budget {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    let needed = min_kv_pages(contract);
    if low < needed {
        return Err(short(needed, low));
    }
    Ok(KvPlan {
        pages: low,
        spans: page_spans(layout, low, window)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proto::{BufferRole, Core};
    use crate::core::sample::tiny_core;
    use crate::core::ValidCore;

    const K: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    /// A small granularity, so that a few pages already fill granules.
    const G: u64 = 64 * K;
    /// Bytes of one page in one slab: page size 16, one head of 64, bf16.
    const PAGE: u64 = 2 * K;

    /// The sample core with its KV pages buffer replaced by a contiguous
    /// bf16 `[layers, 2, pages, 16, 1, 64]` buffer at `offset` (inside the
    /// 8 MiB KV region at 8 MiB), and a context limit that needs
    /// `min_pages` pages.
    fn core(layers: u64, pages: u32, offset: u64, axis: Option<u32>, min_pages: u32) -> ValidCore {
        let mut core: Core = tiny_core();
        let shape = [layers, 2, u64::from(pages), 16, 1, 64];
        let kv = (core.buffers.iter_mut())
            .find(|buffer| buffer.role == BufferRole::KvPages as i32)
            .unwrap();
        *kv = crate::core::sample::contiguous_kv_buffer(offset, &shape);
        let contract = core.contract.as_mut().unwrap();
        contract.kv_pages = pages;
        contract.bytes_per_page = layers * 2 * PAGE;
        contract.kv_page_axis = axis;
        contract.context_limit = (min_pages - 1) * contract.page_size;
        ValidCore::new(core).unwrap()
    }

    fn window(mapped: &[Span]) -> KvWindow<'_> {
        KvWindow {
            granularity: G,
            reservation: 32 * MIB,
            mapped,
        }
    }

    fn span(offset: u64, len: u64) -> Span {
        Span { offset, len }
    }

    /// Free memory that leaves `budget` bytes for the KV pages.
    fn free(budget: u64) -> u64 {
        budget + DRIVER_MARGIN
    }

    #[test]
    fn the_prepared_extent_is_the_regions_recorded_one() {
        let core = core(2, 64, 8 * MIB, Some(2), 2);
        let plan = plan_kv_prepared(core.view(), window(&[])).unwrap();
        assert_eq!(plan.pages, 64);
        assert_eq!(plan.spans, [span(8 * MIB, 8 * MIB)]);
        let mapped = [span(8 * MIB, G)];
        let plan = plan_kv_prepared(core.view(), window(&mapped)).unwrap();
        assert_eq!(plan.spans, [span(8 * MIB + G, 8 * MIB - G)]);
    }

    #[test]
    fn pages_of_every_slab_widen_to_granules_and_merge() {
        // 4 slabs of 64 pages: each slab is two granules.
        let core = core(2, 64, 8 * MIB, Some(2), 2);
        let layout = core.kv_layout().unwrap();
        let first = |slab: u64| span(8 * MIB + slab * 2 * G, G);
        let spans = page_spans(layout, 1, window(&[])).unwrap();
        assert_eq!(spans, [0, 1, 2, 3].map(first));
        assert_eq!(page_spans(layout, 32, window(&[])).unwrap(), spans);
        let all = page_spans(layout, 33, window(&[])).unwrap();
        assert_eq!(all, [span(8 * MIB, 8 * G)]);
        assert!(page_spans(layout, 0, window(&[])).unwrap().is_empty());
    }

    #[test]
    fn unaligned_slabs_share_granules() {
        // Slabs of 48 pages (96 KiB) from 16 KiB into a granule: slab starts
        // 16, 112, 208 and 304 KiB, in granules 0, 1, 3 and 4.
        let core = core(2, 48, 8 * MIB + 16 * K, Some(2), 2);
        let layout = core.kv_layout().unwrap();
        let spans = page_spans(layout, 1, window(&[])).unwrap();
        assert_eq!(spans, [span(8 * MIB, 2 * G), span(8 * MIB + 3 * G, 2 * G)]);
        // A neighbour's span already mapped the first granule.
        let mapped = [span(8 * MIB - G, 2 * G)];
        let spans = page_spans(layout, 1, window(&mapped)).unwrap();
        assert_eq!(spans, [span(8 * MIB + G, G), span(8 * MIB + 3 * G, 2 * G)]);
    }

    #[test]
    fn spans_are_clipped_to_the_reservation() {
        let layout = KvLayout {
            slabs: vec![32 * MIB - PAGE],
            page_stride: PAGE,
        };
        let spans = page_spans(&layout, 2, window(&[])).unwrap();
        assert_eq!(spans, [span(32 * MIB - G, G)]);
    }

    #[test]
    fn the_page_count_is_the_largest_whose_granules_fit() {
        // 1..=32 pages cost one granule per slab (256 KiB), 33..=64 two.
        let core = core(2, 64, 8 * MIB, Some(2), 2);
        for (budget, pages) in [(4 * G, 32), (8 * G - 1, 32), (8 * G, 64)] {
            let plan = plan_kv_from_free(core.view(), window(&[]), free(budget), 0).unwrap();
            assert_eq!(plan.pages, pages, "budget {budget}");
            assert!(plan.mapped_bytes() <= budget);
        }
        let err = plan_kv_from_free(core.view(), window(&[]), free(4 * G - 1), 0).unwrap_err();
        assert!(matches!(
            err,
            ReplayError::InsufficientKvPages { backable: 0, .. }
        ));
    }

    #[test]
    fn the_reserve_comes_off_the_budget() {
        let core = core(2, 64, 8 * MIB, Some(2), 2);
        let plan = plan_kv_from_free(core.view(), window(&[]), free(8 * G), G).unwrap();
        assert_eq!(plan.pages, 32);
        assert_eq!(plan.spans.len(), 4);
    }

    #[test]
    fn fewer_pages_than_one_request_needs_are_refused() {
        let core = core(2, 64, 8 * MIB, Some(2), 40);
        let err = plan_kv_from_free(core.view(), window(&[]), free(4 * G), 0).unwrap_err();
        assert!(matches!(
            err,
            ReplayError::InsufficientKvPages {
                needed: 40,
                backable: 32,
                bytes_per_page: 8192,
                budget,
            } if budget == 4 * G
        ));
    }

    #[test]
    fn never_more_pages_than_prepared() {
        let core = core(2, 64, 8 * MIB, Some(2), 2);
        let plan = plan_kv_from_free(core.view(), window(&[]), 100 << 30, 0).unwrap();
        assert_eq!(plan.pages, 64);
        assert_eq!(plan.spans, [span(8 * MIB, 8 * G)]);
    }

    #[test]
    fn already_mapped_granules_cost_nothing() {
        let core = core(2, 64, 8 * MIB, Some(2), 2);
        let mapped = [span(8 * MIB, 8 * G)];
        let plan = plan_kv_from_free(core.view(), window(&mapped), free(0), 0).unwrap();
        assert_eq!(plan.pages, 64);
        assert!(plan.spans.is_empty());
    }

    #[test]
    fn an_older_core_backs_all_or_nothing() {
        let core = core(2, 64, 8 * MIB, None, 2);
        assert!(core.kv_layout().is_none());
        let plan = plan_kv_from_free(core.view(), window(&[]), free(8 * MIB), 0).unwrap();
        assert_eq!(plan.pages, 64);
        assert_eq!(plan.spans, [span(8 * MIB, 8 * MIB)]);
        let err = plan_kv_from_free(core.view(), window(&[]), free(8 * MIB), 1).unwrap_err();
        assert!(matches!(
            err,
            ReplayError::InsufficientKvPages {
                needed: 64,
                backable: 0,
                ..
            }
        ));
    }

    #[test]
    fn the_minimum_is_one_request_of_the_context_limit_and_the_null_page() {
        let contract = PreparedContract {
            page_size: 16,
            context_limit: 512,
            ..PreparedContract::default()
        };
        assert_eq!(min_kv_pages(&contract), 33);
        assert_eq!(kv_budget(DRIVER_MARGIN + 10, 4), 6);
        assert_eq!(kv_budget(DRIVER_MARGIN, 4), 0);
    }
}
