//! The executor over a loaded core: launches become asynchronous copies and
//! a graph replay on the core's stream.
//!
//! Each submission takes one pinned host slot of a small ring: its packed
//! inputs are copied there and queued to the staging buffers, the graph is
//! queued after them, the completion records are queued back into the same
//! slot, and an event marks the end. Everything runs on one stream, so a
//! launch's staging writes land after the previous graph read its inputs,
//! and its records are copied out before the next graph overwrites them.
//! A slot is reused only after its launch was retrieved, which is only
//! after its event was seen complete. The copy-back addresses are the
//! contract's completion-records and maintenance-status bindings. Nothing
//! here allocates device memory: the ring is allocated when the executor is
//! built.
//!
//! All of it runs on a [`LaunchDevice`] (every [`GraphTarget`] is one), so
//! these rules are tested on the CPU with a recording fake.

use std::collections::VecDeque;
use std::sync::Arc;

use std::rc::Rc;

use super::device::{HostBuffer, LaunchDevice};
use super::staging::{Packed, StagingError, StagingLayout};
use crate::core::ValidCore;
use crate::cuda::{Context, CudaError, Stream, Window};
use crate::replay::LoadedCore;
use crate::scheduler::{Completion, ExecutionError, Executor, Launch, Ticket, MAX_IN_FLIGHT};

/// What the executor drives: a core's contract, its window, the stream its
/// graphs run on, and those graphs by manifest position. A core loaded by
/// Helios ([`LoadedCore`]) is one; graphs borrowed from the process that
/// prepared them ([`super::BorrowedGraphs`]) are another.
pub trait GraphTarget {
    /// The validated manifest (contract, bindings, graph catalog).
    fn core(&self) -> &ValidCore;
    /// The rank of [`Self::core`] whose window and graphs these are (0 for a
    /// one-rank core).
    fn rank(&self) -> u32 {
        0
    }
    /// The CUDA context the graphs live in.
    fn context(&self) -> &Rc<Context>;
    /// The stream the graphs and copies run on.
    fn stream(&self) -> &Stream;
    /// The window the staging buffers lie in.
    fn window(&self) -> &Window;
    /// Queues the graph at manifest position `index` on [`Self::stream`].
    fn launch_graph(&self, index: usize) -> Result<(), CudaError>;
}

impl GraphTarget for LoadedCore {
    fn core(&self) -> &ValidCore {
        LoadedCore::core(self)
    }

    fn rank(&self) -> u32 {
        LoadedCore::rank(self)
    }

    fn context(&self) -> &Rc<Context> {
        LoadedCore::context(self)
    }

    fn stream(&self) -> &Stream {
        LoadedCore::stream(self)
    }

    fn window(&self) -> &Window {
        LoadedCore::window(self)
    }

    fn launch_graph(&self, index: usize) -> Result<(), CudaError> {
        LoadedCore::launch_graph(self, index)
    }
}

/// Launches the scheduler may have in flight ([`MAX_IN_FLIGHT`]).
const RING: usize = MAX_IN_FLIGHT;

struct Slot<D: LaunchDevice> {
    input: D::Host,
    output: D::Host,
    done: D::Marker,
}

struct InFlight {
    ticket: Ticket,
    slot: usize,
    rows: usize,
    status: bool,
}

/// An [`Executor`] over a [`LaunchDevice`]: a [`GraphTarget`] (by default a
/// [`LoadedCore`]), which lives on the thread that created it, or a test's
/// fake.
pub struct GpuExecutor<D: LaunchDevice = LoadedCore> {
    device: D,
    staging: StagingLayout,
    /// The launch being submitted, packed; reused so steps allocate nothing.
    packed: Packed,
    ring: Vec<Slot<D>>,
    in_flight: VecDeque<InFlight>,
    next_ticket: u64,
}

impl<D: LaunchDevice> std::fmt::Debug for GpuExecutor<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuExecutor")
            .field("in_flight", &self.in_flight.len())
            .field("next_ticket", &self.next_ticket)
            .finish_non_exhaustive()
    }
}

fn device(operation: &'static str) -> impl Fn(CudaError) -> ExecutionError {
    move |error| ExecutionError::Device {
        operation,
        source: Arc::new(error),
    }
}

fn staging(error: StagingError) -> ExecutionError {
    ExecutionError::Device {
        operation: "staging",
        source: Arc::new(error),
    }
}

impl<D: LaunchDevice> GpuExecutor<D> {
    /// An executor over `device`, with its pinned ring allocated.
    pub fn new(mut device: D) -> Result<Self, ExecutionError> {
        let rank =
            (device.core().rank(device.rank())).expect("a target's rank is one of its core's");
        let staging_layout = StagingLayout::new(rank).map_err(staging)?;
        let input_bytes = staging_layout.max_packed_bytes();
        let output_bytes =
            staging_layout.record_bytes(staging_layout.max_rows()) + StagingLayout::STATUS_BYTES;
        let ring = (0..RING)
            .map(|_| {
                Ok(Slot {
                    input: device.host_buffer(input_bytes)?,
                    output: device.host_buffer(output_bytes)?,
                    done: device.marker()?,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()
            .map_err(self::device("pinned staging allocation"))?;
        Ok(Self {
            device,
            staging: staging_layout,
            packed: Packed::default(),
            ring,
            in_flight: VecDeque::with_capacity(RING),
            next_ticket: 0,
        })
    }

    /// The device (the target) the executor drives.
    pub fn target(&self) -> &D {
        &self.device
    }

    fn check_oldest(&self, ticket: Ticket) -> Result<&InFlight, ExecutionError> {
        match self.in_flight.front() {
            Some(oldest) if oldest.ticket == ticket => Ok(oldest),
            _ => Err(ExecutionError::UnknownTicket { ticket: ticket.0 }),
        }
    }

    fn retrieve(&mut self) -> Completion {
        let oldest = self.in_flight.pop_front().expect("checked by check_oldest");
        let staging = &self.staging;
        self.ring[oldest.slot]
            .output
            .read(|bytes| staging.completion(bytes, oldest.rows, oldest.status))
    }
}

impl<D: LaunchDevice> Executor for GpuExecutor<D> {
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        if self.in_flight.len() == RING {
            return Err(device("submit")(CudaError::InvalidNode {
                reason: format!("more than {RING} launches in flight"),
            }));
        }
        self.staging
            .pack_into(launch, &mut self.packed)
            .map_err(staging)?;
        let packed = &self.packed;
        let ticket = Ticket(self.next_ticket);
        let index = (self.next_ticket % RING as u64) as usize;
        let slot = &mut self.ring[index];
        // The slot's last launch was retrieved (in order, and fewer than RING
        // are in flight), so its copies have run.
        let capacity = slot.input.capacity();
        if packed.bytes.len() > capacity {
            return Err(staging(StagingError::TooLong {
                what: "packed launch bytes",
                len: packed.bytes.len(),
                capacity: capacity as u64,
            }));
        }
        slot.input.write(&packed.bytes);
        let gpu = &mut self.device;
        for write in &packed.writes {
            gpu.copy_to_device(write.addr, &slot.input, write.offset, write.len)
                .map_err(device("staging copy"))?;
        }
        gpu.launch_graph(packed.graph)
            .map_err(device("graph launch"))?;
        let record_bytes = self.staging.record_bytes(packed.rows);
        gpu.copy_to_host(
            &mut slot.output,
            0,
            self.staging.completions_addr(),
            record_bytes,
        )
        .map_err(device("completion copy"))?;
        if packed.status {
            // The status lands right after the records, where
            // `StagingLayout::completion` reads it.
            gpu.copy_to_host(
                &mut slot.output,
                record_bytes,
                self.staging.status_addr(),
                StagingLayout::STATUS_BYTES,
            )
            .map_err(device("maintenance status copy"))?;
        }
        gpu.record(&slot.done).map_err(device("event record"))?;
        self.in_flight.push_back(InFlight {
            ticket,
            slot: index,
            rows: packed.rows,
            status: packed.status,
        });
        self.next_ticket += 1;
        Ok(ticket)
    }

    fn applies_masks(&self) -> bool {
        self.staging.takes_masks()
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        let slot = self.check_oldest(ticket)?.slot;
        let done = self.device.query(&self.ring[slot].done);
        if !done.map_err(device("poll"))? {
            return Ok(None);
        }
        Ok(Some(self.retrieve()))
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        let slot = self.check_oldest(ticket)?.slot;
        let done = self.device.wait(&self.ring[slot].done);
        done.map_err(device("wait"))?;
        Ok(self.retrieve())
    }

    fn drain(&mut self) -> Result<(), ExecutionError> {
        // The newest launch's marker completes after every earlier one (one
        // stream, issue order).
        match self.in_flight.back() {
            Some(newest) => {
                (self.device.wait(&self.ring[newest.slot].done)).map_err(device("drain"))
            }
            None => Ok(()),
        }
    }
}
