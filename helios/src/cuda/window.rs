//! The fixed virtual-address window: reserved at the exact base the core was
//! exported with, backed span by span, released on drop.
//!
//! Kernel parameters hold raw device addresses (some inside opaque blocks), so
//! nothing is relocated: every buffer must sit at the address it had at export.
//! [`Window::reserve`] asks the driver for the recorded base and fails with
//! [`CudaError::WindowUnavailable`] when the driver places the reservation
//! anywhere else (it returns success with another address when the hint is
//! taken). Reserving, mapping and releasing are the one virtual memory
//! sequence of [`super::Reservation`]; this type adds the span bookkeeping
//! (granularity alignment, no overlap) and the host copies.

use std::rc::Rc;

use cudarc::driver::sys;

use super::context::Context;
use super::error::{check, CudaError};
use super::vmm::Reservation;

/// A range of the window: an offset from its base and a length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span {
    /// Offset from the window base.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Span {
    /// One past the span's last offset (saturating: spans are planned with
    /// checked arithmetic, so this never saturates in practice).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// Whether `[offset, offset + len)` lies in the union of `spans`, which are
/// sorted by offset and do not overlap. An empty range is always covered.
pub fn covered(spans: &[Span], offset: u64, len: u64) -> bool {
    let Some(end) = offset.checked_add(len) else {
        return false;
    };
    if len == 0 {
        return true;
    }
    let mut cursor = offset;
    for span in spans {
        if span.end() <= cursor {
            continue;
        }
        if span.offset > cursor {
            return false;
        }
        cursor = span.end();
        if cursor >= end {
            return true;
        }
    }
    false
}

/// The reserved window and the spans mapped into it.
///
/// A window is owned (reserved and mapped here, released on drop) or
/// borrowed: the same range reserved and mapped by someone else in this
/// process (Heliopause's preparation window, while the prepared model that
/// owns it is alive), which this value only describes and never releases.
#[derive(Debug)]
pub struct Window {
    context: Rc<Context>,
    base: u64,
    size: u64,
    granularity: u64,
    /// Sorted by offset, non-overlapping.
    mapped: Vec<Span>,
    /// The reservation of an owned window; `None` for a borrowed one.
    reservation: Option<Reservation>,
}

impl Window {
    /// Reserves `[base, base + size)` (the size rounded up to the allocation
    /// granularity) at exactly `base`. Nothing is mapped yet.
    pub fn reserve(context: &Rc<Context>, base: u64, size: u64) -> Result<Self, CudaError> {
        let granularity = context.granularity()?;
        let invalid = |reason| CudaError::InvalidSpan {
            offset: 0,
            len: size,
            reason,
        };
        if granularity == 0 {
            return Err(invalid(
                "the driver reported an allocation granularity of 0",
            ));
        }
        if !base.is_multiple_of(granularity) {
            return Err(invalid(
                "the window base is not a multiple of the allocation granularity",
            ));
        }
        let size = size
            .checked_next_multiple_of(granularity)
            .filter(|&size| size > 0 && base.checked_add(size).is_some())
            .ok_or_else(|| invalid("the window size overflows the address space"))?;
        usize::try_from(size).map_err(|_| invalid("the window size exceeds usize"))?;
        let reservation = Reservation::reserve(context.primary(), base, size)?;
        if reservation.base() != base {
            // The reservation exists, only at the wrong place: dropping it
            // gives it back. The mismatch is the error worth reporting.
            return Err(CudaError::WindowUnavailable {
                base,
                got: reservation.base(),
            });
        }
        Ok(Self {
            context: Rc::clone(context),
            base,
            size,
            granularity,
            mapped: Vec::new(),
            reservation: Some(reservation),
        })
    }

    /// Describes a window another owner in this process reserved at `base`
    /// with `mapped` spans (offsets from `base`) backed. Copies and graph
    /// nodes are checked against these spans; nothing is mapped, unmapped
    /// or freed here. The caller keeps the owner alive for this value's life.
    pub fn borrowed(
        context: &Rc<Context>,
        base: u64,
        size: u64,
        mut mapped: Vec<Span>,
    ) -> Result<Self, CudaError> {
        mapped.sort_unstable_by_key(|span| span.offset);
        let invalid = |reason| CudaError::InvalidSpan {
            offset: 0,
            len: size,
            reason,
        };
        if base.checked_add(size).is_none() {
            return Err(invalid("the window overflows the address space"));
        }
        for pair in mapped.windows(2) {
            if pair[0].end() > pair[1].offset {
                return Err(invalid("the borrowed spans overlap"));
            }
        }
        if mapped.last().is_some_and(|span| span.end() > size) {
            return Err(invalid("a borrowed span lies past the window"));
        }
        Ok(Self {
            context: Rc::clone(context),
            base,
            size,
            granularity: context.granularity()?,
            mapped,
            reservation: None,
        })
    }

    /// The window's first address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Reserved bytes (a multiple of the granularity).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The physical allocation granularity.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// The mapped spans, sorted by offset.
    pub fn mapped(&self) -> &[Span] {
        &self.mapped
    }

    /// Bytes backed by device memory.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped.iter().map(|span| span.len).sum()
    }

    /// Whether `[addr, addr + len)` lies in mapped memory.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr.checked_sub(self.base)
            .is_some_and(|offset| covered(&self.mapped, offset, len))
    }

    /// Backs `span` with device memory readable and writable by the device,
    /// and fills it with zeros (queued on the null stream, so ordered before
    /// every later copy and launch).
    pub fn map(&mut self, span: Span) -> Result<(), CudaError> {
        let Some(reservation) = self.reservation.as_mut() else {
            return Err(CudaError::InvalidSpan {
                offset: span.offset,
                len: span.len,
                reason: "a borrowed window is mapped by its owner",
            });
        };
        check_span(span, self.granularity, self.size, &self.mapped)?;
        reservation.map_zeroed(self.base + span.offset, span.len)?;
        let at = self.mapped.partition_point(|m| m.offset < span.offset);
        self.mapped.insert(at, span);
        Ok(())
    }

    /// Grants device `ordinal` (a peer rank's) read/write access to `span`,
    /// which lies in one mapped span of this owned window.
    pub fn grant_access(&mut self, span: Span, ordinal: i32) -> Result<(), CudaError> {
        let Some(reservation) = self.reservation.as_mut() else {
            return Err(CudaError::InvalidSpan {
                offset: span.offset,
                len: span.len,
                reason: "a borrowed window's access is its owner's",
            });
        };
        reservation.grant_access(self.base + span.offset, span.len, ordinal)
    }

    /// Copies `data` to device address `addr` (synchronous, on the null
    /// stream).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), CudaError> {
        let len = data.len() as u64;
        if !self.covers(addr, len) {
            return Err(CudaError::Unmapped { addr, len });
        }
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: the destination lies in mapped window memory (checked
        // above) and the source is `data.len()` readable bytes.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(addr, data.as_ptr().cast(), data.len())
        })
    }

    /// Copies `out.len()` bytes from device address `addr` into `out`
    /// (synchronous, on the null stream).
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), CudaError> {
        let len = out.len() as u64;
        if !self.covers(addr, len) {
            return Err(CudaError::Unmapped { addr, len });
        }
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: the source lies in mapped window memory (checked above)
        // and the destination is `out.len()` writable bytes.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), addr, out.len())
        })
    }
}

/// Refuses a span that is empty, not aligned to `granularity`, reaches past
/// `size` or overlaps a `mapped` span.
fn check_span(span: Span, granularity: u64, size: u64, mapped: &[Span]) -> Result<(), CudaError> {
    let invalid = |reason| CudaError::InvalidSpan {
        offset: span.offset,
        len: span.len,
        reason,
    };
    if span.len == 0 {
        return Err(invalid("the span is empty"));
    }
    if !span.offset.is_multiple_of(granularity) || !span.len.is_multiple_of(granularity) {
        return Err(invalid("not aligned to the allocation granularity"));
    }
    match span.offset.checked_add(span.len) {
        Some(end) if end <= size => {}
        _ => return Err(invalid("reaches past the reservation")),
    }
    if mapped
        .iter()
        .any(|m| m.offset < span.end() && span.offset < m.end())
    {
        return Err(invalid("overlaps a mapped span"));
    }
    usize::try_from(span.len)
        .map(|_| ())
        .map_err(|_| invalid("the span length exceeds usize"))
}

impl Drop for Window {
    /// Waits for all work (nothing may run on memory about to be unmapped);
    /// an owned window then unmaps every span and frees the reservation.
    fn drop(&mut self) {
        let _ = self.context.bind();
        match self.reservation.as_mut() {
            Some(reservation) => {
                let _ = reservation.release();
            }
            None => {
                let _ = self.context.synchronize();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPANS: [Span; 2] = [
        Span {
            offset: 0,
            len: 100,
        },
        Span {
            offset: 100,
            len: 50,
        },
    ];

    #[test]
    fn a_range_inside_one_span_is_covered() {
        assert!(covered(&SPANS, 10, 20));
        assert!(covered(&SPANS[1..], 100, 50));
    }

    #[test]
    fn a_range_across_adjacent_spans_is_covered() {
        assert!(covered(&SPANS, 90, 60));
    }

    #[test]
    fn a_range_past_the_last_span_is_not_covered() {
        assert!(!covered(&SPANS, 140, 11));
        assert!(!covered(&SPANS, 200, 1));
    }

    #[test]
    fn a_range_over_a_hole_is_not_covered() {
        let spans = [
            Span { offset: 0, len: 10 },
            Span {
                offset: 20,
                len: 10,
            },
        ];
        assert!(!covered(&spans, 5, 20));
        assert!(!covered(&spans, 12, 2));
        assert!(covered(&spans, 20, 10));
    }

    #[test]
    fn an_overflowing_range_is_not_covered() {
        assert!(!covered(&SPANS, u64::MAX, 2));
    }

    #[test]
    fn an_empty_range_is_covered() {
        assert!(covered(&[], 12, 0));
    }
}
