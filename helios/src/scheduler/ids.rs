//! Identifiers the scheduler and the executor share: slots, pages, requests.

use std::fmt;

/// A request-state slot: one row of the per-slot device state.
///
/// Slot 0 is the null slot: padded rows of every graph point at it and
/// commits mask it out. Live requests occupy slots `1..=max_concurrency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u32);

impl Slot {
    /// The null slot padding rows point at.
    pub const NULL: Slot = Slot(0);

    /// Whether this is the null slot.
    pub fn is_null(self) -> bool {
        self == Self::NULL
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {}", self.0)
    }
}

/// A physical KV page. Page 0 is the null page: padded writes land there and
/// an unused page-table entry points at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Page(pub u32);

impl Page {
    /// The null page unused page-table entries point at.
    pub const NULL: Page = Page(0);

    /// Whether this is the null page.
    pub fn is_null(self) -> bool {
        self == Self::NULL
    }
}

impl fmt::Display for Page {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {}", self.0)
    }
}

/// A request's stable identifier, assigned at submission and carried by
/// every event about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.0)
    }
}
