//! The snapshot-row pool: a fixed number of rows, each free, reserved for a
//! capture, or held by one checkpoint.

use std::collections::{BTreeSet, VecDeque};

use super::ids::SnapshotRow;

#[derive(Debug)]
pub(super) struct RowPool {
    rows: u32,
    free: VecDeque<SnapshotRow>,
    reserved: BTreeSet<SnapshotRow>,
}

impl RowPool {
    pub(super) fn new(rows: u32) -> Self {
        Self {
            rows,
            free: (0..rows).map(SnapshotRow).collect(),
            reserved: BTreeSet::new(),
        }
    }

    pub(super) fn rows(&self) -> u32 {
        self.rows
    }

    pub(super) fn free_count(&self) -> u32 {
        u32::try_from(self.free.len()).expect("row counts are u32")
    }

    pub(super) fn reserved_count(&self) -> u32 {
        u32::try_from(self.reserved.len()).expect("row counts are u32")
    }

    pub(super) fn free_rows(&self) -> impl Iterator<Item = SnapshotRow> + '_ {
        self.free.iter().copied()
    }

    pub(super) fn reserved_rows(&self) -> impl Iterator<Item = SnapshotRow> + '_ {
        self.reserved.iter().copied()
    }

    /// Reserves the row freed longest ago.
    pub(super) fn take(&mut self) -> Option<SnapshotRow> {
        let row = self.free.pop_front()?;
        self.reserved.insert(row);
        Some(row)
    }

    pub(super) fn is_reserved(&self, row: SnapshotRow) -> bool {
        self.reserved.contains(&row)
    }

    /// A reservation no copy writes any more, given back unused.
    pub(super) fn unreserve(&mut self, row: SnapshotRow) {
        assert!(
            self.reserved.remove(&row),
            "unreserving {row}, not reserved"
        );
        self.free.push_back(row);
    }

    /// A reservation becomes a checkpoint's row.
    pub(super) fn adopt(&mut self, row: SnapshotRow) {
        assert!(self.reserved.remove(&row), "adopting {row}, not reserved");
    }

    /// A retired checkpoint's row, no GPU use outstanding.
    pub(super) fn release(&mut self, row: SnapshotRow) {
        debug_assert!(!self.free.contains(&row) && !self.reserved.contains(&row));
        self.free.push_back(row);
    }
}
