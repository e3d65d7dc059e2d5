//! The page ledger: the one owner of request-state slots, KV pages, page
//! reservations, each slot's page table and the page-table updates that
//! travel with the next launch.
//!
//! Rules, enforced here and nowhere else:
//! - a placement holds its slot through a [`SlotLease`], which cannot be
//!   copied; [`PageLedger::release`] consumes it, so a slot and its pages
//!   are given back exactly once, in one place;
//! - a slot's page table is its checkpoint-shared pages (never written, never
//!   freed by the request: the prefix cache owns them) followed by private
//!   pages, each taken from the placement's own reservation;
//! - every change of a page table is queued as a [`PageTableUpdate`] for the
//!   next launch, and a released table is cleared to the null page before the
//!   slot is reused;
//! - a page or slot goes back to its pool only once no launch in flight
//!   references it: the caller releases a lease at a submission boundary
//!   where its placement has no launch in flight (`retire.rs`).

use std::collections::BTreeMap;

use super::executor::PageTableUpdate;
use super::ids::{Page, Slot};
use super::pool::{PagePool, SlotPool};
use super::request::len32;

/// The right to a slot and its page table, held by one placement.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SlotLease(Slot);

impl SlotLease {
    /// The slot.
    pub(super) fn slot(&self) -> Slot {
        self.0
    }
}

/// One leased slot's pages.
#[derive(Debug, Default)]
struct Table {
    /// Physical pages, in logical order.
    pages: Vec<Page>,
    /// Free pages promised to this slot, not yet in its table.
    reserved: u32,
    /// Leading entries that are checkpoint pages.
    shared: u32,
}

/// Slots, pages, reservations and page tables.
#[derive(Debug)]
pub(super) struct PageLedger {
    slots: SlotPool,
    pool: PagePool,
    tables: BTreeMap<Slot, Table>,
    updates: Vec<PageTableUpdate>,
}

impl PageLedger {
    pub(super) fn new(max_concurrency: u32, kv_pages: u32) -> Self {
        Self {
            slots: SlotPool::new(max_concurrency),
            pool: PagePool::new(kv_pages),
            tables: BTreeMap::new(),
            updates: Vec::new(),
        }
    }

    pub(super) fn has_free_slot(&self) -> bool {
        self.slots.has_free()
    }

    /// Leases a free slot with `reserved` free pages promised to it; the
    /// caller checked [`Self::has_free_slot`] and [`Self::available`].
    pub(super) fn lease(&mut self, reserved: u32) -> SlotLease {
        let slot = self.slots.take().expect("leasing checked for a free slot");
        self.pool.reserve(reserved);
        let table = Table {
            reserved,
            ..Table::default()
        };
        let previous = self.tables.insert(slot, table);
        debug_assert!(previous.is_none(), "a free slot has no table");
        SlotLease(slot)
    }

    /// Starts a fresh table with a checkpoint's complete pages.
    pub(super) fn share(&mut self, lease: &SlotLease, pages: Vec<Page>) {
        let table = self.table_mut(lease);
        debug_assert!(table.pages.is_empty(), "shared pages lead the table");
        table.shared = len32(pages.len());
        table.pages.clone_from(&pages);
        if !pages.is_empty() {
            self.updates.push(PageTableUpdate {
                slot: lease.slot(),
                first: 0,
                pages,
            });
        }
    }

    /// Promises `count` more free pages to the slot; the caller checked
    /// [`Self::available`].
    pub(super) fn reserve(&mut self, lease: &SlotLease, count: u32) {
        self.pool.reserve(count);
        self.table_mut(lease).reserved += count;
    }

    /// Moves reserved pages into the slot's table until it has `upto`.
    pub(super) fn take(&mut self, lease: &SlotLease, upto: u32) {
        let table = self.tables.get_mut(&lease.slot()).expect("a leased slot");
        let first = len32(table.pages.len());
        let mut taken = Vec::new();
        while len32(table.pages.len()) < upto {
            assert!(table.reserved > 0, "taking a page that was not reserved");
            table.reserved -= 1;
            let page = self.pool.take_reserved();
            table.pages.push(page);
            taken.push(page);
        }
        if !taken.is_empty() {
            self.updates.push(PageTableUpdate {
                slot: lease.slot(),
                first,
                pages: taken,
            });
        }
    }

    /// Gives back the slot's untaken reservation (its placement ended).
    pub(super) fn unreserve(&mut self, lease: &SlotLease) {
        let unused = std::mem::take(&mut self.table_mut(lease).reserved);
        self.pool.unreserve(unused);
    }

    /// The table's first `upto` pages now belong to a published checkpoint.
    pub(super) fn mark_shared(&mut self, lease: &SlotLease, upto: u32) {
        let table = self.table_mut(lease);
        debug_assert!(upto <= len32(table.pages.len()));
        table.shared = table.shared.max(upto);
    }

    /// The slot's page table.
    pub(super) fn pages(&self, lease: &SlotLease) -> &[Page] {
        &self.table(lease).pages
    }

    /// Leading checkpoint pages of the slot's table.
    pub(super) fn shared(&self, lease: &SlotLease) -> u32 {
        self.table(lease).shared
    }

    /// Pages in the table plus pages reserved.
    pub(super) fn held(&self, lease: &SlotLease) -> u32 {
        let table = self.table(lease);
        len32(table.pages.len()) + table.reserved
    }

    /// Pages reserved for the slot and not yet taken.
    pub(super) fn reserved_by(&self, lease: &SlotLease) -> u32 {
        self.table(lease).reserved
    }

    /// Pages of the table that releasing it frees: all but the shared ones.
    pub(super) fn private(&self, lease: &SlotLease) -> u32 {
        let table = self.table(lease);
        len32(table.pages.len()) - table.shared
    }

    /// Gives back a slot no launch in flight references: its table is
    /// cleared to the null page (the update travels with the next launch),
    /// its private pages and the slot return to their pools.
    pub(super) fn release(&mut self, lease: SlotLease) {
        let slot = lease.slot();
        let table = self.tables.remove(&slot).expect("a leased slot");
        debug_assert_eq!(
            table.reserved, 0,
            "a released slot's reservation was given back"
        );
        if !table.pages.is_empty() {
            self.updates.push(PageTableUpdate {
                slot,
                first: 0,
                pages: vec![Page::NULL; table.pages.len()],
            });
            self.pool.release(&table.pages[table.shared as usize..]);
        }
        self.slots.release(slot);
    }

    /// Returns pages of evicted checkpoints (no table maps them, no launch
    /// in flight reads them).
    pub(super) fn free_evicted(&mut self, pages: &[Page]) {
        self.pool.release(pages);
    }

    /// Free pages nobody reserved.
    pub(super) fn available(&self) -> u32 {
        self.pool.available()
    }

    /// Free pages reserved for leased slots.
    pub(super) fn reserved(&self) -> u32 {
        self.pool.reserved()
    }

    /// Pages in some page table or held by checkpoints.
    pub(super) fn used(&self) -> u32 {
        self.pool.used()
    }

    /// The page-table changes for the next launch.
    pub(super) fn take_updates(&mut self) -> Vec<PageTableUpdate> {
        std::mem::take(&mut self.updates)
    }

    fn table(&self, lease: &SlotLease) -> &Table {
        self.tables.get(&lease.slot()).expect("a leased slot")
    }

    fn table_mut(&mut self, lease: &SlotLease) -> &mut Table {
        self.tables.get_mut(&lease.slot()).expect("a leased slot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_takes_its_reservation_and_gives_everything_back_once() {
        let mut ledger = PageLedger::new(2, 9);
        let lease = ledger.lease(3);
        assert_eq!((ledger.available(), ledger.reserved()), (5, 3));
        ledger.take(&lease, 2);
        assert_eq!(ledger.pages(&lease), &[Page(1), Page(2)]);
        assert_eq!((ledger.held(&lease), ledger.used()), (3, 2));
        let updates = ledger.take_updates();
        assert_eq!(updates.len(), 1);
        assert_eq!((updates[0].slot, updates[0].first), (lease.slot(), 0));
        ledger.unreserve(&lease);
        assert_eq!((ledger.available(), ledger.reserved()), (6, 0));
        let slot = lease.slot();
        ledger.release(lease);
        let cleared = ledger.take_updates();
        assert_eq!(cleared[0].slot, slot);
        assert_eq!(cleared[0].pages, vec![Page::NULL; 2]);
        assert_eq!((ledger.available(), ledger.used()), (8, 0));
        assert!(ledger.has_free_slot());
    }

    #[test]
    fn shared_pages_lead_the_table_and_are_never_freed_by_it() {
        let mut ledger = PageLedger::new(1, 9);
        // Two pages a checkpoint holds (taken out of the pool by an earlier
        // placement that published them).
        let first = ledger.lease(2);
        ledger.take(&first, 2);
        ledger.mark_shared(&first, 2);
        let shared = ledger.pages(&first).to_vec();
        assert_eq!(ledger.private(&first), 0);
        ledger.unreserve(&first);
        ledger.release(first);
        assert_eq!(ledger.used(), 2, "the checkpoint keeps its pages");
        let lease = ledger.lease(1);
        ledger.share(&lease, shared.clone());
        ledger.take(&lease, 3);
        assert_eq!((ledger.shared(&lease), ledger.private(&lease)), (2, 1));
        ledger.unreserve(&lease);
        ledger.release(lease);
        assert_eq!(ledger.used(), 2);
        ledger.free_evicted(&shared);
        assert_eq!((ledger.used(), ledger.available()), (0, 8));
    }
}
