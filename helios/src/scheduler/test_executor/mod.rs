//! A deterministic executor on the CPU, for tests only.
//!
//! It emulates the device state the graphs keep (per-slot pending token,
//! consumed and generated counts, finish flag, Philox counter, penalty
//! histogram, page tables and KV cells) and writes completion records as
//! the graphs do. Its [`FakeModel`] makes the next token a pure function of
//! the request's seed, draw counter and history, so every schedule of a
//! request must reproduce [`FakeModel::reference`]. It executes a launch
//! when it is submitted (one stream) and hands the completion back after a
//! configurable number of polls; it records every launch, checks each one
//! against the executor contract ([`Violation`]) and can corrupt a record or
//! fail a launch on request.
//!
//! Compiled only with the `test-support` feature (and in Helios's own unit
//! tests), so the default library, the `flare` binary and the Heliopause
//! wheel never contain it.

mod device;
mod model;
mod transcript;
mod violation;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

pub use model::{FakeModel, History, Reference, Script};
pub use transcript::{RequestLog, RunError, Transcript};
pub use violation::Violation;

use self::device::{Device, Touched};
use super::error::ExecutionError;
use super::executor::{
    Completion, CompletionRecord, Executor, Launch, OperationKind, Ticket, MAX_IN_FLIGHT,
};
use super::geometry::Geometry;

/// A field of a completion record, for [`Corruption::Field`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordField {
    /// `slot`.
    Slot,
    /// `token`.
    Token,
    /// `generated`.
    Generated,
    /// `consumed`.
    Consumed,
    /// `done`.
    Done,
    /// `valid`.
    Valid,
}

/// How to damage a launch's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    /// Overwrite one field of one row.
    Field {
        /// The row.
        row: usize,
        /// The field.
        field: RecordField,
        /// The raw value written.
        value: i32,
    },
    /// Drop the last record.
    DropRecord,
    /// Overwrite the maintenance status a snapshot or restore reports.
    Status(i32),
}

/// The failure [`TestExecutor::fail_next`] injects.
#[derive(Debug, thiserror::Error)]
#[error("injected device failure at launch {launch}")]
pub struct InjectedFailure {
    /// The launch that failed.
    pub launch: u64,
}

/// Launches submitted, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaunchCounts {
    /// Admit launches.
    pub admit: u64,
    /// Prefill chunks.
    pub prefill: u64,
    /// Decode steps.
    pub decode: u64,
    /// Resume launches.
    pub resume: u64,
    /// Snapshot launches.
    pub snapshot: u64,
    /// Restore launches.
    pub restore: u64,
}

#[derive(Debug)]
struct Outstanding {
    ticket: Ticket,
    kind: OperationKind,
    records: Vec<CompletionRecord>,
    status: Option<i32>,
    touched: Touched,
    polls_left: u32,
}

/// The deterministic test executor.
#[derive(Debug)]
pub struct TestExecutor {
    device: Device,
    delay: u32,
    outstanding: VecDeque<Outstanding>,
    next_ticket: u64,
    log: Vec<Launch>,
    counts: LaunchCounts,
    violations: Vec<Violation>,
    corruptions: BTreeMap<OperationKind, VecDeque<Corruption>>,
    fail_next: bool,
    max_decodes_in_flight: usize,
}

impl TestExecutor {
    /// An executor over the geometry's slots and pages, running `model`,
    /// with no snapshot row; completions are ready at the first poll.
    pub fn new(geometry: &Geometry, model: FakeModel) -> Self {
        Self::with_snapshot_rows(geometry, model, 0)
    }

    /// [`Self::new`] with a snapshot-row pool of `rows` rows.
    pub fn with_snapshot_rows(geometry: &Geometry, model: FakeModel, rows: u32) -> Self {
        Self {
            device: Device::new(geometry, model, rows),
            delay: 0,
            outstanding: VecDeque::new(),
            next_ticket: 0,
            log: Vec::new(),
            counts: LaunchCounts::default(),
            violations: Vec::new(),
            corruptions: BTreeMap::new(),
            fail_next: false,
            max_decodes_in_flight: 0,
        }
    }

    /// Completions of launches submitted from now on come back only after
    /// `polls` unsuccessful polls (a wait always gets them).
    pub fn set_completion_delay(&mut self, polls: u32) {
        self.delay = polls;
    }

    /// Damages the completion of the next launch of `kind`.
    pub fn corrupt_next(&mut self, kind: OperationKind, corruption: Corruption) {
        self.corruptions
            .entry(kind)
            .or_default()
            .push_back(corruption);
    }

    /// Makes the next submission fail with [`InjectedFailure`].
    pub fn fail_next(&mut self) {
        self.fail_next = true;
    }

    /// Every launch submitted, in order.
    pub fn log(&self) -> &[Launch] {
        &self.log
    }

    /// Launches submitted, by kind.
    pub fn counts(&self) -> LaunchCounts {
        self.counts
    }

    /// Contract breaches seen so far.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// The most decode steps that were in flight at once.
    pub fn max_decodes_in_flight(&self) -> usize {
        self.max_decodes_in_flight
    }

    /// The model it runs.
    pub fn device_model(&self) -> &FakeModel {
        self.device.model()
    }

    /// Launches whose completion was not retrieved yet.
    pub fn in_flight(&self) -> usize {
        self.outstanding.len()
    }

    fn busy(&self) -> Touched {
        let mut busy = Touched::default();
        for launch in &self.outstanding {
            busy.slots.extend(&launch.touched.slots);
            busy.entries.extend(&launch.touched.entries);
            busy.written.extend(&launch.touched.written);
        }
        busy
    }

    fn take_oldest(&mut self, ticket: Ticket) -> Result<Outstanding, ExecutionError> {
        match self.outstanding.front() {
            Some(oldest) if oldest.ticket == ticket => {
                Ok(self.outstanding.pop_front().expect("the oldest exists"))
            }
            _ => Err(ExecutionError::UnknownTicket { ticket: ticket.0 }),
        }
    }
}

fn corrupt(records: &mut Vec<CompletionRecord>, status: &mut Option<i32>, corruption: Corruption) {
    match corruption {
        Corruption::DropRecord => {
            records.pop();
        }
        Corruption::Status(value) => *status = Some(value),
        Corruption::Field { row, field, value } => {
            if let Some(record) = records.get_mut(row) {
                let target = match field {
                    RecordField::Slot => &mut record.slot,
                    RecordField::Token => &mut record.token,
                    RecordField::Generated => &mut record.generated,
                    RecordField::Consumed => &mut record.consumed,
                    RecordField::Done => &mut record.done,
                    RecordField::Valid => &mut record.valid,
                };
                *target = value;
            }
        }
    }
}

impl Executor for TestExecutor {
    /// The emulated sampler applies masks, as the captured one does.
    fn applies_masks(&self) -> bool {
        true
    }

    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        let index = self.log.len() as u64;
        if std::mem::take(&mut self.fail_next) {
            return Err(ExecutionError::Device {
                operation: "test launch",
                source: Arc::new(InjectedFailure { launch: index }),
            });
        }
        self.log.push(launch.clone());
        let kind = launch.operation.kind();
        let counter = match kind {
            OperationKind::Admit => &mut self.counts.admit,
            OperationKind::PrefillChunk => &mut self.counts.prefill,
            OperationKind::Decode => &mut self.counts.decode,
            OperationKind::Resume => &mut self.counts.resume,
            OperationKind::Snapshot => &mut self.counts.snapshot,
            OperationKind::Restore => &mut self.counts.restore,
        };
        *counter += 1;
        if self.outstanding.len() >= MAX_IN_FLIGHT {
            self.violations
                .push(Violation::TooManyInFlight { launch: index });
        }
        let busy = self.busy();
        let violations = &mut self.violations;
        self.device
            .update_tables(index, &launch.page_updates, &busy, violations);
        let (mut records, mut status, touched) =
            self.device
                .execute(index, &launch.operation, &busy, violations);
        if let Some(corruption) = self
            .corruptions
            .get_mut(&kind)
            .and_then(VecDeque::pop_front)
        {
            corrupt(&mut records, &mut status, corruption);
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.outstanding.push_back(Outstanding {
            ticket,
            kind,
            records,
            status,
            touched,
            polls_left: self.delay,
        });
        let decodes = (self.outstanding.iter())
            .filter(|launch| launch.kind == OperationKind::Decode)
            .count();
        self.max_decodes_in_flight = self.max_decodes_in_flight.max(decodes);
        Ok(ticket)
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        let oldest = match self.outstanding.front_mut() {
            Some(oldest) if oldest.ticket == ticket => oldest,
            _ => return Err(ExecutionError::UnknownTicket { ticket: ticket.0 }),
        };
        if oldest.polls_left > 0 {
            oldest.polls_left -= 1;
            return Ok(None);
        }
        let oldest = self.take_oldest(ticket)?;
        Ok(Some(Completion {
            records: oldest.records,
            status: oldest.status,
        }))
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        let oldest = self.take_oldest(ticket)?;
        Ok(Completion {
            records: oldest.records,
            status: oldest.status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proto::PreparedContract;
    use crate::prefix::SnapshotRow;
    use crate::scheduler::executor::{
        Admit, Decode, Operation, PageTableUpdate, PrefillChunk, Restore, Resume, Snapshot,
    };
    use crate::scheduler::ids::{Page, Slot};
    use crate::scheduler::SamplingParams;

    fn executor() -> TestExecutor {
        executor_with_rows(0)
    }

    #[test]
    fn a_launch_beyond_the_in_flight_bound_is_flagged() {
        let mut executor = executor();
        let prompt = [1, 2, 3];
        for _ in 0..MAX_IN_FLIGHT {
            executor.submit(&launch(vec![], admit(1, &prompt))).unwrap();
        }
        assert_eq!(executor.violations(), []);
        executor.submit(&launch(vec![], admit(1, &prompt))).unwrap();
        let launch = MAX_IN_FLIGHT as u64;
        assert_eq!(
            executor.violations(),
            [Violation::TooManyInFlight { launch }]
        );
    }

    /// Four-token pages, two slots, and `rows` snapshot rows.
    fn executor_with_rows(rows: u32) -> TestExecutor {
        let contract = PreparedContract {
            page_size: 4,
            max_concurrency: 2,
            context_limit: 64,
            prefill_chunk_size: 8,
            decode_capacities: vec![1, 2],
            prefill_capacities: vec![8],
            kv_pages: 9,
            vocab_size: 50,
            ..PreparedContract::default()
        };
        let geometry = Geometry::from_contract(&contract, &[0]).unwrap();
        TestExecutor::with_snapshot_rows(&geometry, FakeModel::new(&geometry, None), rows)
    }

    fn launch(page_updates: Vec<PageTableUpdate>, operation: Operation) -> Launch {
        Launch {
            page_updates,
            operation,
        }
    }

    fn admit(slot: u32, prompt: &[u32]) -> Operation {
        Operation::Admit(Admit {
            slot: Slot(slot),
            prompt: prompt.to_vec(),
            max_new_tokens: 10,
            sampling: SamplingParams::default(),
            seed: 3,
            consumed: 0,
        })
    }

    fn map(slot: u32, pages: &[u32]) -> PageTableUpdate {
        PageTableUpdate {
            slot: Slot(slot),
            first: 0,
            pages: pages.iter().copied().map(Page).collect(),
        }
    }

    fn chunk(slot: u32, tokens: &[u32]) -> Operation {
        Operation::PrefillChunk(PrefillChunk {
            slot: Slot(slot),
            capacity: 8,
            tokens: tokens.to_vec(),
            samples: true,
            mask: None,
        })
    }

    #[test]
    fn a_well_formed_request_samples_the_reference() {
        let mut executor = executor();
        let prompt = [5, 6, 7, 8, 9];
        let model = executor.device_model();
        let expected = model.reference(&prompt, 10, 3).tokens;
        executor
            .submit(&launch(vec![map(1, &[1, 2])], admit(1, &prompt)))
            .unwrap();
        let ticket = executor.submit(&launch(vec![], chunk(1, &prompt))).unwrap();
        executor.wait(Ticket(0)).unwrap();
        let record = executor.wait(ticket).unwrap().records[0];
        assert_eq!(
            (record.token, record.consumed, record.valid),
            (expected[0] as i32, 5, 1)
        );
        let decode = Operation::Decode(Decode {
            capacity: 2,
            slots: vec![Slot(1), Slot::NULL],
            masks: Vec::new(),
        });
        let ticket = executor.submit(&launch(vec![], decode)).unwrap();
        let records = executor.wait(ticket).unwrap().records;
        assert_eq!(records[0].token, expected[1] as i32);
        assert_eq!((records[1].slot, records[1].valid), (0, 0));
        assert!(
            executor.violations().is_empty(),
            "{:?}",
            executor.violations()
        );
    }

    #[test]
    fn resume_after_a_restore_samples_like_the_end_of_the_prompt() {
        let mut executor = executor_with_rows(2);
        let prompt = [5, 6, 7, 8, 9, 10];
        let expected = executor.device_model().reference(&prompt, 10, 3).tokens;
        executor
            .submit(&launch(vec![map(1, &[1, 2])], admit(1, &prompt)))
            .unwrap();
        executor.submit(&launch(vec![], chunk(1, &prompt))).unwrap();
        let row = SnapshotRow(1);
        let snapshot = Operation::Snapshot(Snapshot { slot: Slot(1), row });
        executor.submit(&launch(vec![], snapshot)).unwrap();
        executor.wait(Ticket(0)).unwrap();
        let prefilled = executor.wait(Ticket(1)).unwrap().records[0];
        assert_eq!(prefilled.token, expected[0] as i32);
        assert_eq!(executor.wait(Ticket(2)).unwrap().status, Some(1));
        // Slot 2 shares page 1 and gets a private tail page 3 for positions
        // 4..6, which the restore fills from the row.
        let Operation::Admit(mut restored) = admit(2, &prompt) else {
            unreachable!()
        };
        restored.consumed = 6;
        let mapping = vec![map(2, &[1, 3])];
        executor
            .submit(&launch(mapping, Operation::Admit(restored)))
            .unwrap();
        let wrong = Operation::Restore(Restore {
            slot: Slot(2),
            row,
            expect: 5,
        });
        executor.submit(&launch(vec![], wrong)).unwrap();
        let restore = Operation::Restore(Restore {
            slot: Slot(2),
            row,
            expect: 6,
        });
        executor.submit(&launch(vec![], restore)).unwrap();
        let resume = Operation::Resume(Resume {
            slot: Slot(2),
            mask: None,
        });
        executor.submit(&launch(vec![], resume)).unwrap();
        executor.wait(Ticket(3)).unwrap();
        assert_eq!(executor.wait(Ticket(4)).unwrap().status, Some(0));
        assert_eq!(executor.wait(Ticket(5)).unwrap().status, Some(1));
        let record = executor.wait(Ticket(6)).unwrap().records[0];
        let sampled = (
            record.slot,
            record.token,
            record.generated,
            record.consumed,
            record.valid,
        );
        assert_eq!(sampled, (2, expected[0] as i32, 1, 6, 1));
        assert!(
            executor.violations().is_empty(),
            "{:?}",
            executor.violations()
        );
    }

    #[test]
    fn a_resume_needs_the_hidden_vector_of_the_admitted_history() {
        // An admit leaves the slot's hidden vector alone, as the graphs do:
        // admitted back with the same history at the count it holds, the
        // slot resumes; another request's history finds it stale.
        let run = |readmitted: &[u32]| {
            let mut executor = executor();
            let prompt = [5, 6, 7];
            executor
                .submit(&launch(vec![map(1, &[1])], admit(1, &prompt)))
                .unwrap();
            let Operation::PrefillChunk(mut prefill) = chunk(1, &prompt) else {
                unreachable!()
            };
            prefill.samples = false;
            executor
                .submit(&launch(vec![], Operation::PrefillChunk(prefill)))
                .unwrap();
            let Operation::Admit(mut readmit) = admit(1, readmitted) else {
                unreachable!()
            };
            readmit.consumed = 3;
            executor.wait(Ticket(0)).unwrap();
            executor.wait(Ticket(1)).unwrap();
            executor
                .submit(&launch(vec![], Operation::Admit(readmit)))
                .unwrap();
            let resume = Operation::Resume(Resume {
                slot: Slot(1),
                mask: None,
            });
            executor.submit(&launch(vec![], resume)).unwrap();
            executor.violations().to_vec()
        };
        assert_eq!(run(&[5, 6, 7]), []);
        // The pages "already hold" the other prompt, but nothing restored it.
        assert!(run(&[5, 6, 8]).contains(&Violation::StaleHidden {
            launch: 3,
            slot: Slot(1)
        }));
    }

    #[test]
    fn reusing_a_slot_or_page_in_flight_is_flagged() {
        let mut executor = executor();
        executor
            .submit(&launch(vec![map(1, &[1, 2])], admit(1, &[5, 6])))
            .unwrap();
        executor.submit(&launch(vec![], chunk(1, &[5, 6]))).unwrap();
        // Both launches are still in flight.
        executor
            .submit(&launch(vec![map(2, &[1])], admit(1, &[7])))
            .unwrap();
        let violations = executor.violations();
        assert!(violations.contains(&Violation::PageInFlight {
            launch: 2,
            page: Page(1)
        }));
        assert!(violations.contains(&Violation::SlotInFlight {
            launch: 2,
            slot: Slot(1)
        }));
        // Page 1 is now mapped by slots 1 and 2: writing it is flagged.
        executor.submit(&launch(vec![], admit(2, &[7]))).unwrap();
        executor.submit(&launch(vec![], chunk(2, &[7]))).unwrap();
        assert!(executor
            .violations()
            .contains(&Violation::SharedPageWritten {
                launch: 4,
                page: Page(1)
            }));
    }

    #[test]
    fn reading_another_requests_page_or_the_null_page_is_flagged() {
        let mut executor = executor();
        executor
            .submit(&launch(vec![map(1, &[1])], admit(1, &[5, 6])))
            .unwrap();
        executor.submit(&launch(vec![], chunk(1, &[5, 6]))).unwrap();
        executor
            .submit(&launch(vec![map(2, &[2])], admit(2, &[7, 8, 9, 10, 11])))
            .unwrap();
        executor
            .submit(&launch(vec![], chunk(2, &[7, 8, 9, 10, 11])))
            .unwrap();
        for ticket in 0..4 {
            executor.wait(Ticket(ticket)).unwrap();
        }
        // Slot 2 wrote position 4 through a null entry; now slot 1 is
        // pointed at the page slot 2 wrote.
        let remap = vec![map(2, &[0]), map(1, &[2])];
        let decode = Operation::Decode(Decode {
            capacity: 1,
            slots: vec![Slot(1)],
            masks: Vec::new(),
        });
        executor.submit(&launch(remap, decode)).unwrap();
        let violations = executor.violations();
        assert!(violations.contains(&Violation::NullPageAccess {
            launch: 3,
            slot: Slot(2),
            position: 4
        }));
        assert!(violations.contains(&Violation::ForeignPage {
            launch: 4,
            slot: Slot(1),
            position: 0,
            page: Page(2)
        }));
    }
}
