//! Index-based pools of slots and KV pages.
//!
//! A page is free, reserved (free but promised to an admitted request), or
//! used (in a slot's page table). Reservations are counts, not page ids: the
//! page a request takes is the oldest free one.

use std::collections::VecDeque;

use super::ids::{Page, Slot};

/// Free request-state slots `1..=max_concurrency`.
#[derive(Debug)]
pub(super) struct SlotPool {
    free: VecDeque<Slot>,
}

impl SlotPool {
    pub(super) fn new(max_concurrency: u32) -> Self {
        Self {
            free: (1..=max_concurrency).map(Slot).collect(),
        }
    }

    pub(super) fn take(&mut self) -> Option<Slot> {
        self.free.pop_front()
    }

    /// Returns a slot no submitted launch references any more.
    pub(super) fn release(&mut self, slot: Slot) {
        debug_assert!(!slot.is_null() && !self.free.contains(&slot));
        self.free.push_back(slot);
    }

    pub(super) fn has_free(&self) -> bool {
        !self.free.is_empty()
    }
}

/// KV pages `1..kv_pages` (page 0 is the null page).
#[derive(Debug)]
pub(super) struct PagePool {
    free: VecDeque<Page>,
    reserved: u32,
    usable: u32,
}

impl PagePool {
    pub(super) fn new(kv_pages: u32) -> Self {
        Self {
            free: (1..kv_pages).map(Page).collect(),
            reserved: 0,
            usable: kv_pages - 1,
        }
    }

    /// Free pages nobody reserved.
    pub(super) fn available(&self) -> u32 {
        self.free_count() - self.reserved
    }

    /// Free pages reserved for admitted requests.
    pub(super) fn reserved(&self) -> u32 {
        self.reserved
    }

    /// Pages in some page table.
    pub(super) fn used(&self) -> u32 {
        self.usable - self.free_count()
    }

    fn free_count(&self) -> u32 {
        u32::try_from(self.free.len()).expect("page counts are u32")
    }

    /// Promises `count` free pages; the caller checked [`Self::available`].
    pub(super) fn reserve(&mut self, count: u32) {
        assert!(
            count <= self.available(),
            "reserving pages that are not available"
        );
        self.reserved += count;
    }

    /// Gives back `count` reserved pages that were never taken.
    pub(super) fn unreserve(&mut self, count: u32) {
        assert!(count <= self.reserved, "unreserving pages never reserved");
        self.reserved -= count;
    }

    /// Takes one reserved page.
    pub(super) fn take_reserved(&mut self) -> Page {
        self.unreserve(1);
        self.free
            .pop_front()
            .expect("a reservation is backed by a free page")
    }

    /// Returns pages no submitted launch references any more.
    pub(super) fn release(&mut self, pages: &[Page]) {
        debug_assert!(pages.iter().all(|p| !p.is_null() && !self.free.contains(p)));
        self.free.extend(pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_hold_free_pages_back() {
        let mut pool = PagePool::new(5);
        assert_eq!((pool.available(), pool.used()), (4, 0));
        pool.reserve(3);
        assert_eq!((pool.available(), pool.reserved()), (1, 3));
        let page = pool.take_reserved();
        assert_eq!(page, Page(1));
        assert_eq!((pool.available(), pool.reserved(), pool.used()), (1, 2, 1));
        pool.unreserve(2);
        pool.release(&[page]);
        assert_eq!((pool.available(), pool.used()), (4, 0));
    }

    #[test]
    fn slots_skip_the_null_slot_and_recycle_in_order() {
        let mut slots = SlotPool::new(2);
        assert_eq!(slots.take(), Some(Slot(1)));
        assert_eq!(slots.take(), Some(Slot(2)));
        assert!(!slots.has_free());
        slots.release(Slot(1));
        assert_eq!(slots.take(), Some(Slot(1)));
    }
}
