//! The KV pages buffer as slabs of pages, from `contract.kv_page_axis`.
//!
//! The buffer's shape is `[slab axes..., pages, page axes...]` (Ignition:
//! `[layers, 2, pages, page_size, kv_heads, head_dim]`, page axis 2). Every
//! index of the slab axes is one slab; inside a slab page `p` starts `p`
//! page strides from page 0. So pages `[0, n)` of every slab can be backed
//! without the rest, which is how a load backs fewer pages than prepared.

use super::error::{CoreError, KvAxisProblem};
use super::proto::{Buffer, BufferRole, DType, PreparedContract, Region, RegionKind};
use super::validate::itemsize;

/// Most slabs a KV pages buffer may have. A slab is one (layer, K/V) pair, so
/// real cores have a few hundred; the bound keeps a hostile manifest from
/// making the loader plan billions of spans.
pub const MAX_KV_SLABS: u64 = 1 << 16;

/// Where the KV pages lie in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Window offset of page 0 of every slab, in index order.
    pub slabs: Vec<u64>,
    /// Bytes from one page of a slab to the next; one page of every slab
    /// together is `contract.bytes_per_page`.
    pub page_stride: u64,
}

impl KvLayout {
    /// Window ranges `[start, end)` holding pages `[0, pages)`, one per slab.
    pub fn page_ranges(&self, pages: u32) -> impl Iterator<Item = (u64, u64)> + '_ {
        let len = self.page_stride.saturating_mul(u64::from(pages));
        (self.slabs.iter()).map(move |&start| (start, start.saturating_add(len)))
    }
}

/// Checks `contract.kv_page_axis` against the KV pages buffer and returns the
/// buffer's layout, or `None` when the contract names no axis (cores exported
/// before it existed). Runs after the buffers' views and the contract were
/// checked.
pub(crate) fn check_kv_layout(
    contract: &PreparedContract,
    buffers: &[Buffer],
    regions: &[Region],
) -> Result<Option<KvLayout>, CoreError> {
    let Some(axis) = contract.kv_page_axis else {
        return Ok(None);
    };
    let mut kv = (buffers.iter()).filter(|buffer| buffer.role == BufferRole::KvPages as i32);
    let buffer = kv.next().ok_or(CoreError::Missing {
        field: "a BUFFER_ROLE_KV_PAGES buffer (contract.kv_page_axis is set)",
    })?;
    if let Some(second) = kv.next() {
        return Err(CoreError::Duplicate {
            what: "BUFFER_ROLE_KV_PAGES buffer",
            name: second.name.clone(),
        });
    }
    layout(buffer, axis, contract, regions)
        .map(Some)
        .map_err(|problem| CoreError::KvPageAxis {
            buffer: buffer.name.clone(),
            axis,
            problem,
        })
}

fn layout(
    buffer: &Buffer,
    axis: u32,
    contract: &PreparedContract,
    regions: &[Region],
) -> Result<KvLayout, KvAxisProblem> {
    let rank = buffer.shape.len();
    let page_axis = usize::try_from(axis)
        .ok()
        .filter(|&axis| axis < rank)
        .ok_or(KvAxisProblem::PastRank { rank })?;
    if buffer.shape.contains(&0) {
        return Err(KvAxisProblem::EmptyDimension);
    }
    let (shape, strides) = (&buffer.shape, &buffer.strides);
    if shape[page_axis] != u64::from(contract.kv_pages) {
        return Err(KvAxisProblem::PageCount {
            found: shape[page_axis],
            kv_pages: contract.kv_pages,
        });
    }
    // The view was checked to fit its buffer, so none of these saturate.
    let stride = strides[page_axis];
    let span = (shape[page_axis + 1..].iter())
        .zip(&strides[page_axis + 1..])
        .fold(1u64, |span, (&dim, &step)| {
            span.saturating_add((dim - 1).saturating_mul(step))
        });
    if span > stride {
        return Err(KvAxisProblem::PageOverlap { span, stride });
    }
    let slabs = (shape[..page_axis].iter()).fold(1u64, |count, &dim| count.saturating_mul(dim));
    if slabs > MAX_KV_SLABS {
        return Err(KvAxisProblem::TooManySlabs {
            slabs,
            limit: MAX_KV_SLABS,
        });
    }
    let size = DType::try_from(buffer.dtype).map_or(0, itemsize);
    let stride_bytes = stride.saturating_mul(size);
    let computed = u128::from(slabs) * u128::from(stride_bytes);
    if computed != u128::from(contract.bytes_per_page) {
        return Err(KvAxisProblem::BytesPerPage {
            slabs,
            stride_bytes,
            computed,
            declared: contract.bytes_per_page,
        });
    }
    let end = buffer.offset.saturating_add(buffer.size_bytes);
    let inside = regions.iter().any(|region| {
        region.kind == RegionKind::KvPages as i32
            && region.offset <= buffer.offset
            && end <= region.offset.saturating_add(region.size)
    });
    if !inside {
        return Err(KvAxisProblem::OutsideRegion);
    }
    Ok(KvLayout {
        slabs: slab_offsets(buffer, page_axis, size, slabs),
        page_stride: stride_bytes,
    })
}

/// Window offset of page 0 of every slab: the slab axes walked in row-major
/// order.
fn slab_offsets(buffer: &Buffer, page_axis: usize, itemsize: u64, slabs: u64) -> Vec<u64> {
    let (shape, strides) = (&buffer.shape[..page_axis], &buffer.strides[..page_axis]);
    let mut index = vec![0u64; page_axis];
    let mut offsets = Vec::new();
    for _ in 0..slabs {
        let element = (index.iter().zip(strides)).fold(0u64, |sum, (&i, &stride)| {
            sum.saturating_add(i.saturating_mul(stride))
        });
        offsets.push(
            buffer
                .offset
                .saturating_add(element.saturating_mul(itemsize)),
        );
        for axis in (0..page_axis).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A contiguous bf16 buffer of `shape` at `offset`.
    fn buffer(offset: u64, shape: &[u64]) -> Buffer {
        crate::core::sample::contiguous_kv_buffer(offset, shape)
    }

    fn contract(kv_pages: u32, bytes_per_page: u64, axis: u32) -> PreparedContract {
        PreparedContract {
            kv_pages,
            bytes_per_page,
            kv_page_axis: Some(axis),
            ..PreparedContract::default()
        }
    }

    fn kv_region() -> Vec<Region> {
        vec![Region {
            kind: RegionKind::KvPages as i32,
            offset: 0,
            size: 64 * MIB,
            backed_bytes: 64 * MIB,
        }]
    }

    fn problem(buffer: &Buffer, contract: &PreparedContract) -> KvAxisProblem {
        let axis = contract.kv_page_axis.unwrap();
        layout(buffer, axis, contract, &kv_region()).unwrap_err()
    }

    #[test]
    fn ignitions_layout_is_slabs_of_layer_and_k_v() {
        // [layers 3, 2, pages 5, page_size 4, heads 2, dim 8], bf16.
        let kv = buffer(4096, &[3, 2, 5, 4, 2, 8]);
        let page = 4 * 2 * 8 * 2;
        let layout = layout(&kv, 2, &contract(5, 6 * page, 2), &kv_region()).unwrap();
        assert_eq!(layout.page_stride, page);
        let slab = 5 * page;
        let expected: Vec<u64> = (0..6).map(|s| 4096 + s * slab).collect();
        assert_eq!(layout.slabs, expected);
        let ranges: Vec<_> = layout.page_ranges(2).take(2).collect();
        assert_eq!(
            ranges,
            [
                (4096, 4096 + 2 * page),
                (4096 + slab, 4096 + slab + 2 * page)
            ]
        );
    }

    #[test]
    fn a_leading_page_axis_is_one_slab() {
        let kv = buffer(0, &[8, 2, 16, 64]);
        let layout = layout(&kv, 0, &contract(8, 4096, 0), &kv_region()).unwrap();
        assert_eq!(layout.slabs, [0]);
        assert_eq!(layout.page_stride, 4096);
    }

    #[test]
    fn slabs_follow_the_strides_not_the_shape() {
        // Layer slabs padded apart: layer stride 1000 elements instead of 2 x 5 x 8.
        let mut kv = buffer(0, &[2, 2, 5, 8]);
        kv.strides = vec![1000, 40, 8, 1];
        kv.size_bytes = 2 * (1000 + 40 + 4 * 8 + 7 + 1);
        let layout = layout(&kv, 2, &contract(5, 4 * 16, 2), &kv_region()).unwrap();
        assert_eq!(layout.slabs, [0, 80, 2000, 2080]);
    }

    #[test]
    fn every_mismatch_has_its_problem() {
        let kv = buffer(0, &[3, 2, 5, 4, 2, 8]);
        let page = 6 * 4 * 2 * 8 * 2;
        assert_eq!(
            problem(&kv, &contract(5, page, 6)),
            KvAxisProblem::PastRank { rank: 6 }
        );
        assert_eq!(
            problem(&kv, &contract(6, page, 2)),
            KvAxisProblem::PageCount {
                found: 5,
                kv_pages: 6
            }
        );
        assert!(matches!(
            problem(&kv, &contract(5, page + 2, 2)),
            KvAxisProblem::BytesPerPage { declared, computed, .. }
                if declared == page + 2 && computed == u128::from(page)
        ));
        // Axis 3 (page_size 4) does count 4 things, but the contract's
        // bytes_per_page is not 24 slabs of one row.
        assert!(matches!(
            problem(&kv, &contract(4, page, 3)),
            KvAxisProblem::BytesPerPage { slabs: 30, .. }
        ));
        let mut empty = kv.clone();
        empty.shape[4] = 0;
        assert_eq!(
            problem(&empty, &contract(5, page, 2)),
            KvAxisProblem::EmptyDimension
        );
        let mut overlapping = kv.clone();
        overlapping.strides[2] = 32;
        assert_eq!(
            problem(&overlapping, &contract(5, page, 2)),
            KvAxisProblem::PageOverlap {
                span: 64,
                stride: 32
            }
        );
        let mut many = buffer(0, &[MAX_KV_SLABS + 1, 2, 1]);
        many.strides = vec![0, 1, 1];
        assert!(matches!(
            problem(&many, &contract(2, 2, 1)),
            KvAxisProblem::TooManySlabs { .. }
        ));
        let outside = buffer(64 * MIB, &[3, 2, 5, 4, 2, 8]);
        assert_eq!(
            problem(&outside, &contract(5, page, 2)),
            KvAxisProblem::OutsideRegion
        );
    }
}
