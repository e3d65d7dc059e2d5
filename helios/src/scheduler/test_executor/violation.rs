//! Contract breaches the test executor detects in what it is asked to run.

use crate::prefix::SnapshotRow;
use crate::scheduler::ids::{Page, Slot};

/// A launch that breaks the executor contract; `launch` is the launch's
/// position in submission order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A slot outside `1..=max_concurrency` (or the null slot where a live
    /// one is needed).
    SlotOutOfRange {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
    },
    /// A page outside the KV region.
    PageOutOfRange {
        /// The launch.
        launch: u64,
        /// The page.
        page: Page,
    },
    /// A chunk or decode on a slot no admit initialized.
    UninitializedSlot {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
    },
    /// A launch beyond [`crate::scheduler::MAX_IN_FLIGHT`] unretrieved ones
    /// (the GPU executor's ring of completion records holds no more).
    TooManyInFlight {
        /// The launch.
        launch: u64,
    },
    /// A slot was admitted again while an unfinished launch references it,
    /// other than by the same request (same history, seed and budget).
    SlotInFlight {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
    },
    /// A page-table entry an unfinished launch used was changed.
    PageTableInFlight {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
        /// The logical page.
        logical: u32,
    },
    /// A page an unfinished launch wrote was mapped elsewhere, or a page an
    /// unfinished launch used through another entry was written.
    PageInFlight {
        /// The launch.
        launch: u64,
        /// The page.
        page: Page,
    },
    /// A page mapped by two page-table entries at once (a shared
    /// checkpoint page) was written.
    SharedPageWritten {
        /// The launch.
        launch: u64,
        /// The page.
        page: Page,
    },
    /// A snapshot row outside the pool.
    RowOutOfRange {
        /// The launch.
        launch: u64,
        /// The row.
        row: SnapshotRow,
    },
    /// A resume sampled from a hidden vector that is not the slot's last
    /// consumed token's (no restore installed it).
    StaleHidden {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
    },
    /// A live row read or wrote a position whose page-table entry is the
    /// null page.
    NullPageAccess {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
        /// The token position.
        position: u32,
    },
    /// A live row read a KV cell another slot or admission wrote.
    ForeignPage {
        /// The launch.
        launch: u64,
        /// The reading slot.
        slot: Slot,
        /// The token position.
        position: u32,
        /// The page read.
        page: Page,
    },
    /// A graph capacity that was not captured, rows that do not fit it, or
    /// the same slot twice in a decode.
    Capacity {
        /// The launch.
        launch: u64,
    },
    /// A chunk's tokens are not the admitted prompt's next tokens, or it
    /// samples before the prompt's end.
    ChunkTokens {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
    },
    /// A decode of a slot whose prompt was not fully consumed.
    DecodeBeforePrompt {
        /// The launch.
        launch: u64,
        /// The slot.
        slot: Slot,
    },
}
