//! Emulated device state: per-slot request state, page tables, KV pages
//! whose cells remember which slot and admission wrote them (so reading a
//! page another request wrote is caught as a [`Violation`] unless it lies in
//! the prefix the slot restored), and snapshot rows.
//!
//! Pages may be mapped by several page-table entries at once (a checkpoint's
//! shared pages), but a page mapped twice must never be written.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{FakeModel, History};
use super::violation::Violation;
use crate::prefix::SnapshotRow;
use crate::scheduler::executor::{
    done, Admit, CompletionRecord, Decode, Operation, PageTableUpdate, PrefillChunk, Restore,
    Resume, Snapshot,
};
use crate::scheduler::geometry::Geometry;
use crate::scheduler::ids::{Page, Slot};

/// One slot's request state, as the graphs keep it.
#[derive(Debug, Clone, Default)]
struct SlotState {
    /// Admissions into this slot so far; 0 before the first.
    epoch: u64,
    prompt: Vec<u32>,
    /// Tokens present at admission (a prefix restore).
    restored: u32,
    pending: u32,
    consumed: u32,
    generated: u32,
    max_new: u32,
    done: i32,
    seed: u64,
    counter: u64,
    histogram: u64,
    /// The admitted history's fingerprint: an admission of the same history
    /// (a request admitted back at another consumed count) keeps the
    /// slot's hidden vector meaningful.
    prompt_key: u64,
    /// The final hidden vector the slot holds (what the resume graph samples
    /// from): the consumed count it belongs to and the fingerprint of the
    /// history it was computed from. An admit keeps it, as the graphs do.
    hidden: Option<(u32, u64)>,
}

impl SlotState {
    /// The consumed count whose hidden vector the slot holds, when it was
    /// computed from the admitted history.
    fn hidden_at(&self) -> Option<u32> {
        (self.hidden).and_then(|(at, key)| (key == self.prompt_key).then_some(at))
    }
}

/// A fingerprint of an admitted history.
fn fingerprint(tokens: &[u32]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// One snapshot row: the consumed count, the partial tail page's cells and
/// the hidden vector's position.
#[derive(Debug, Clone)]
struct RowState {
    consumed: u32,
    tail: Vec<Option<Cell>>,
    hidden_at: Option<u32>,
}

/// Who wrote a KV cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    token: u32,
    slot: Slot,
    epoch: u64,
}

/// What a launch touched: slots, and page-table entries with the page they
/// held.
#[derive(Debug, Clone, Default)]
pub(super) struct Touched {
    pub(super) slots: BTreeSet<Slot>,
    pub(super) entries: BTreeSet<(Slot, u32, Page)>,
    /// Pages written.
    pub(super) written: BTreeSet<Page>,
}

/// The emulated device.
#[derive(Debug)]
pub(super) struct Device {
    geometry: Geometry,
    model: FakeModel,
    slots: Vec<SlotState>,
    tables: Vec<Vec<Page>>,
    cells: Vec<Vec<Option<Cell>>>,
    /// Page -> the page-table entries that map it.
    mapped: BTreeMap<Page, BTreeSet<(Slot, u32)>>,
    rows: Vec<Option<RowState>>,
}

impl Device {
    pub(super) fn new(geometry: &Geometry, model: FakeModel, snapshot_rows: u32) -> Self {
        let rows = geometry.max_concurrency() as usize + 1;
        let entries = geometry.pages_for(geometry.context_limit()) as usize;
        Self {
            model,
            slots: vec![SlotState::default(); rows],
            tables: vec![vec![Page::NULL; entries]; rows],
            cells: vec![vec![None; geometry.page_size() as usize]; geometry.kv_pages() as usize],
            mapped: BTreeMap::new(),
            rows: vec![None; snapshot_rows as usize],
            geometry: geometry.clone(),
        }
    }

    pub(super) fn model(&self) -> &FakeModel {
        &self.model
    }

    /// Applies page-table updates; `busy` holds what unfinished launches
    /// touched.
    pub(super) fn update_tables(
        &mut self,
        launch: u64,
        updates: &[PageTableUpdate],
        busy: &Touched,
        violations: &mut Vec<Violation>,
    ) {
        for update in updates {
            let slot = update.slot;
            if slot.is_null() || slot.0 > self.geometry.max_concurrency() {
                violations.push(Violation::SlotOutOfRange { launch, slot });
                continue;
            }
            for (offset, &page) in (0u32..).zip(&update.pages) {
                let logical = update.first + offset;
                let Some(&old) = self.tables[slot.0 as usize].get(logical as usize) else {
                    violations.push(Violation::Capacity { launch });
                    continue;
                };
                if old == page {
                    continue;
                }
                if busy.entries.contains(&(slot, logical, old)) {
                    violations.push(Violation::PageTableInFlight {
                        launch,
                        slot,
                        logical,
                    });
                }
                if page.0 >= self.geometry.kv_pages() {
                    violations.push(Violation::PageOutOfRange { launch, page });
                    continue;
                }
                if !page.is_null() {
                    if busy.written.contains(&page) {
                        violations.push(Violation::PageInFlight { launch, page });
                    }
                    self.mapped.entry(page).or_default().insert((slot, logical));
                }
                if let Some(entries) = self.mapped.get_mut(&old) {
                    entries.remove(&(slot, logical));
                    if entries.is_empty() {
                        self.mapped.remove(&old);
                    }
                }
                self.tables[slot.0 as usize][logical as usize] = page;
            }
        }
    }

    /// Executes one operation: its records, its maintenance status and what
    /// it touched.
    pub(super) fn execute(
        &mut self,
        launch: u64,
        operation: &Operation,
        busy: &Touched,
        violations: &mut Vec<Violation>,
    ) -> (Vec<CompletionRecord>, Option<i32>, Touched) {
        let mut run = Run {
            device: self,
            launch,
            touched: Touched::default(),
            violations,
            busy,
        };
        let (records, status) = match operation {
            Operation::Admit(admit) => {
                run.admit(admit);
                (Vec::new(), None)
            }
            Operation::PrefillChunk(chunk) => (vec![run.prefill(chunk)], None),
            Operation::Decode(decode) => (run.decode(decode), None),
            Operation::Resume(Resume { slot, mask }) => {
                (vec![run.resume(*slot, mask.as_deref())], None)
            }
            Operation::Snapshot(snapshot) => (Vec::new(), Some(run.snapshot(snapshot))),
            Operation::Restore(restore) => (Vec::new(), Some(run.restore(restore))),
        };
        (records, status, run.touched)
    }
}

/// One launch being executed.
struct Run<'a> {
    device: &'a mut Device,
    launch: u64,
    touched: Touched,
    violations: &'a mut Vec<Violation>,
    busy: &'a Touched,
}

impl Run<'_> {
    fn flag(&mut self, violation: Violation) {
        self.violations.push(violation);
    }

    /// Whether `slot` is a live slot that was admitted.
    fn live(&mut self, slot: Slot) -> bool {
        let launch = self.launch;
        if slot.0 > self.device.geometry.max_concurrency() {
            self.flag(Violation::SlotOutOfRange { launch, slot });
            return false;
        }
        if slot.is_null() {
            return false;
        }
        self.touched.slots.insert(slot);
        if self.device.slots[slot.0 as usize].epoch == 0 {
            self.flag(Violation::UninitializedSlot { launch, slot });
            return false;
        }
        true
    }

    fn admit(&mut self, admit: &Admit) {
        let (launch, slot) = (self.launch, admit.slot);
        if slot.is_null() || slot.0 > self.device.geometry.max_concurrency() {
            self.flag(Violation::SlotOutOfRange { launch, slot });
            return;
        }
        let state = &self.device.slots[slot.0 as usize];
        // Admitting the same request back at another consumed count (a
        // capture inside a chunk) follows its own launches in flight: the
        // stream runs them first. It stays the same admission (its epoch and
        // restored prefix), so the foreign-page check keeps its strength.
        let same_request = state.epoch > 0
            && (state.prompt_key, state.seed, state.max_new)
                == (fingerprint(&admit.prompt), admit.seed, admit.max_new_tokens);
        let busy = self.busy.slots.contains(&slot);
        if busy && !same_request {
            self.flag(Violation::SlotInFlight { launch, slot });
        }
        self.touched.slots.insert(slot);
        let state = &mut self.device.slots[slot.0 as usize];
        let (epoch, restored) = if busy && same_request {
            (state.epoch, state.restored)
        } else {
            (state.epoch + 1, admit.consumed)
        };
        *state = SlotState {
            epoch,
            prompt: admit.prompt.clone(),
            restored,
            consumed: admit.consumed,
            max_new: admit.max_new_tokens,
            seed: admit.seed,
            counter: 0,
            histogram: History::of(&admit.prompt).histogram(),
            prompt_key: fingerprint(&admit.prompt),
            hidden: state.hidden,
            ..SlotState::default()
        };
    }

    fn prefill(&mut self, chunk: &PrefillChunk) -> CompletionRecord {
        let (launch, slot) = (self.launch, chunk.slot);
        let len = chunk.tokens.len();
        let captured = self
            .device
            .geometry
            .prefill_capacities()
            .contains(&chunk.capacity);
        if !captured || len == 0 || len > chunk.capacity as usize {
            self.flag(Violation::Capacity { launch });
        }
        if !self.live(slot) {
            return self.record(slot, None);
        }
        let state = &self.device.slots[slot.0 as usize];
        let consumed = state.consumed;
        let start = consumed as usize;
        let expected = state.prompt.get(start..start + len);
        let ends = start + len == state.prompt.len();
        if expected != Some(chunk.tokens.as_slice()) || (chunk.samples && !ends) {
            self.flag(Violation::ChunkTokens { launch, slot });
        }
        for (position, &token) in (consumed..).zip(&chunk.tokens) {
            self.write(slot, position, token);
        }
        let state = &mut self.device.slots[slot.0 as usize];
        state.consumed += u32::try_from(len).expect("chunk fits");
        state.hidden = Some((state.consumed, state.prompt_key));
        let sampled = chunk.samples && len > 0;
        let token = sampled.then(|| self.sample(slot, chunk.mask.as_deref()));
        self.record(slot, token)
    }

    fn decode(&mut self, decode: &Decode) -> Vec<CompletionRecord> {
        let launch = self.launch;
        let captured = self
            .device
            .geometry
            .decode_capacities()
            .contains(&decode.capacity);
        let live_rows: Vec<Slot> = decode
            .slots
            .iter()
            .copied()
            .filter(|s| !s.is_null())
            .collect();
        let distinct: BTreeSet<Slot> = live_rows.iter().copied().collect();
        if !captured
            || decode.slots.len() != decode.capacity as usize
            || distinct.len() != live_rows.len()
        {
            self.flag(Violation::Capacity { launch });
        }
        let mut records = Vec::with_capacity(decode.slots.len());
        for (row, &slot) in decode.slots.iter().enumerate() {
            let mask = decode.masks.get(row).and_then(Option::as_deref);
            let active =
                self.live(slot) && self.device.slots[slot.0 as usize].done == done::RUNNING;
            if !active {
                records.push(self.record(slot, None));
                continue;
            }
            let state = &self.device.slots[slot.0 as usize];
            let (position, pending) = (state.consumed, state.pending);
            if (position as usize) < state.prompt.len() {
                self.flag(Violation::DecodeBeforePrompt { launch, slot });
            }
            self.write(slot, position, pending);
            let state = &mut self.device.slots[slot.0 as usize];
            state.consumed += 1;
            state.hidden = Some((state.consumed, state.prompt_key));
            let token = self.sample(slot, mask);
            records.push(self.record(slot, Some(token)));
        }
        records
    }

    fn resume(&mut self, slot: Slot, mask: Option<&[u32]>) -> CompletionRecord {
        let active = self.live(slot) && self.device.slots[slot.0 as usize].done == done::RUNNING;
        if active {
            let state = &self.device.slots[slot.0 as usize];
            if state.hidden_at() != Some(state.consumed) {
                let launch = self.launch;
                self.flag(Violation::StaleHidden { launch, slot });
            }
        }
        let token = active.then(|| self.sample(slot, mask));
        self.record(slot, token)
    }

    /// The snapshot row `row`, flagged when outside the pool.
    fn row_index(&mut self, row: SnapshotRow) -> Option<usize> {
        let index = row.0 as usize;
        if index >= self.device.rows.len() {
            let launch = self.launch;
            self.flag(Violation::RowOutOfRange { launch, row });
            return None;
        }
        Some(index)
    }

    /// The physical tail page and its first position for a slot at
    /// `consumed`; `None` at an aligned endpoint.
    fn tail(&mut self, slot: Slot, consumed: u32) -> Option<(Page, u32)> {
        let page_size = self.device.geometry.page_size();
        if consumed.is_multiple_of(page_size) {
            return None;
        }
        let start = consumed - consumed % page_size;
        self.page(slot, start).map(|(page, _)| (page, start))
    }

    fn snapshot(&mut self, snapshot: &Snapshot) -> i32 {
        let slot = snapshot.slot;
        let Some(index) = self.row_index(snapshot.row) else {
            return 0;
        };
        if !self.live(slot) {
            return 0;
        }
        let state = &self.device.slots[slot.0 as usize];
        let (consumed, hidden_at) = (state.consumed, state.hidden_at());
        let tail = match self.tail(slot, consumed) {
            Some((page, start)) => {
                let cells = &self.device.cells[page.0 as usize];
                cells[..(consumed - start) as usize].to_vec()
            }
            None => Vec::new(),
        };
        self.device.rows[index] = Some(RowState {
            consumed,
            tail,
            hidden_at,
        });
        1
    }

    fn restore(&mut self, restore: &Restore) -> i32 {
        let slot = restore.slot;
        let Some(index) = self.row_index(restore.row) else {
            return 0;
        };
        if !self.live(slot) {
            return 0;
        }
        let Some(row) = self.device.rows[index].clone() else {
            return 0;
        };
        if row.consumed != restore.expect {
            return 0;
        }
        if let Some((page, _)) = self.tail(slot, row.consumed) {
            self.check_write(page);
            let cells = &mut self.device.cells[page.0 as usize];
            cells[..row.tail.len()].copy_from_slice(&row.tail);
        }
        let state = &mut self.device.slots[slot.0 as usize];
        state.consumed = row.consumed;
        state.hidden = row.hidden_at.map(|at| (at, state.prompt_key));
        1
    }

    /// Flags a write to a page mapped by several entries, or one a launch in
    /// flight touched through another entry.
    fn check_write(&mut self, page: Page) {
        let launch = self.launch;
        let mapped = self.device.mapped.get(&page).map_or(0, BTreeSet::len);
        if mapped > 1 {
            self.flag(Violation::SharedPageWritten { launch, page });
        }
        if self.busy.entries.iter().any(|&(_, _, used)| used == page) && !self.busy_owner(page) {
            self.flag(Violation::PageInFlight { launch, page });
        }
        self.touched.written.insert(page);
    }

    /// Whether every in-flight use of `page` is through the entry that maps
    /// it now (the same request's earlier launches).
    fn busy_owner(&self, page: Page) -> bool {
        let entries = self.device.mapped.get(&page);
        (self.busy.entries.iter())
            .filter(|&&(_, _, used)| used == page)
            .all(|&(slot, logical, _)| entries.is_some_and(|e| e.contains(&(slot, logical))))
    }

    /// The physical page of `position` in `slot`'s page table.
    fn page(&mut self, slot: Slot, position: u32) -> Option<(Page, usize)> {
        let page_size = self.device.geometry.page_size();
        let logical = position / page_size;
        let page = self.device.tables[slot.0 as usize]
            .get(logical as usize)
            .copied();
        let page = page.unwrap_or(Page::NULL);
        self.touched.entries.insert((slot, logical, page));
        if page.is_null() {
            let launch = self.launch;
            self.flag(Violation::NullPageAccess {
                launch,
                slot,
                position,
            });
            return None;
        }
        Some((page, (position % page_size) as usize))
    }

    fn write(&mut self, slot: Slot, position: u32, token: u32) {
        let epoch = self.device.slots[slot.0 as usize].epoch;
        if let Some((page, offset)) = self.page(slot, position) {
            self.check_write(page);
            self.device.cells[page.0 as usize][offset] = Some(Cell { token, slot, epoch });
        }
    }

    /// Samples from the slot's history read through its page table, then
    /// commits like the graphs: pending token, counts, counter, finish flag.
    /// A mask restricts the draw to the tokens it allows, as the captured
    /// sampler applies it before filtering.
    fn sample(&mut self, slot: Slot, mask: Option<&[u32]>) -> u32 {
        let launch = self.launch;
        let state = &self.device.slots[slot.0 as usize];
        let (consumed, restored, epoch) = (state.consumed, state.restored, state.epoch);
        let mut tokens = Vec::with_capacity(consumed as usize);
        for position in 0..consumed {
            let Some((page, offset)) = self.page(slot, position) else {
                continue;
            };
            match self.device.cells[page.0 as usize][offset] {
                Some(cell) if position < restored || (cell.slot, cell.epoch) == (slot, epoch) => {
                    tokens.push(cell.token);
                }
                _ => self.flag(Violation::ForeignPage {
                    launch,
                    slot,
                    position,
                    page,
                }),
            }
        }
        let state = &mut self.device.slots[slot.0 as usize];
        let history = History::of(&tokens).with_histogram(state.histogram);
        let token = self
            .device
            .model
            .sample(state.seed, state.counter, history, &tokens, mask);
        let mut counts = History::default().with_histogram(state.histogram);
        counts.count(token);
        state.histogram = counts.histogram();
        state.pending = token;
        state.generated += 1;
        state.counter += 1;
        state.done = if self.device.geometry.is_stop(token) {
            done::STOP
        } else if state.generated >= state.max_new {
            done::LENGTH
        } else {
            done::RUNNING
        };
        token
    }

    fn record(&self, slot: Slot, token: Option<u32>) -> CompletionRecord {
        let state = self
            .device
            .slots
            .get(slot.0 as usize)
            .cloned()
            .unwrap_or_default();
        let raw = |value: u32| i32::try_from(value).unwrap_or(i32::MAX);
        CompletionRecord {
            slot: raw(slot.0),
            token: token.map_or(-1, raw),
            generated: raw(state.generated),
            consumed: raw(state.consumed),
            done: state.done,
            valid: i32::from(token.is_some()),
        }
    }
}
