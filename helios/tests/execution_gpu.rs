//! `GpuExecutor` against a recording CPU fake of the device, over the staging
//! contract Ignition exported (the tiny-core fixture), as `replay_check.rs`
//! tests the replay loop.
//!
//! The fake queues every copy, launch and marker record on one stream and
//! runs them only when the host queries (while the device is "ready") or
//! waits for a marker, reading and writing host bytes at run time, the way
//! asynchronous copies do. It records what the host may know: any host
//! access to a buffer that a queued operation may still touch, before a
//! marker recorded after that operation was seen complete, is a violation.
//! The tests check the ring's reuse, that the copy-back addresses are the
//! contract's bindings, and the order per launch: staging copies, the
//! launch, the copies back, the marker.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;

use helios::core::load_manifest;
use helios::core::proto::{Binding, Buffer, BufferRole, DType, GraphKind, Semantic};
use helios::core::ValidCore;
use helios::cuda::CudaError;
use helios::execution::{GpuExecutor, HostBuffer, LaunchDevice, StagingLayout};
use helios::prefix::SnapshotRow;
use helios::scheduler::{
    CompletionRecord, Decode, ExecutionError, Executor, Launch, Operation, Resume, Slot, Snapshot,
    Ticket, MAX_IN_FLIGHT,
};

/// Every device call the executor makes, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    HostBuffer {
        host: usize,
        len: usize,
    },
    Marker(usize),
    ToDevice {
        host: usize,
        offset: usize,
        addr: u64,
        len: usize,
    },
    Launch(usize),
    ToHost {
        host: usize,
        offset: usize,
        addr: u64,
        len: usize,
    },
    Record(usize),
    Query(usize),
    Wait(usize),
}

/// A queued stream operation.
#[derive(Debug, Clone, Copy)]
enum Op {
    ToDevice {
        host: usize,
        offset: usize,
        addr: u64,
        len: usize,
    },
    Launch(usize),
    ToHost {
        host: usize,
        offset: usize,
        addr: u64,
        len: usize,
    },
    Record,
}

struct State {
    core: ValidCore,
    calls: Vec<Call>,
    /// Issued, not yet run: (stream position, operation).
    queue: VecDeque<(usize, Op)>,
    issued: usize,
    /// Operations `[0, ran)` have run.
    ran: usize,
    /// The host knows operations `[0, seen)` have run.
    seen: usize,
    /// Whether a query lets the device run up to the queried marker.
    ready: bool,
    fail_launch: bool,
    memory: HashMap<u64, u8>,
    hosts: Vec<Vec<u8>>,
    /// Per host buffer: one past the stream position of the last operation
    /// that reads or writes it (0: none).
    last_use: Vec<usize>,
    /// Per marker: the stream position of its last record.
    markers: Vec<Option<usize>>,
    /// Graph launches run so far.
    launches_run: i32,
    /// Per launch run: the graph and the decode slots it read.
    graph_inputs: Vec<(usize, Vec<i32>)>,
    /// Per launch run on a core with token masks: the mask flags it read,
    /// and the words of each flagged row.
    mask_inputs: Vec<(Vec<i32>, Vec<Vec<i32>>)>,
    violations: Vec<String>,
}

type Shared = Rc<RefCell<State>>;

impl State {
    fn issue(&mut self, op: Op) -> usize {
        let at = self.issued;
        self.queue.push_back((at, op));
        self.issued += 1;
        at
    }

    fn touch(&mut self, host: usize, at: usize) {
        self.last_use[host] = at + 1;
    }

    fn host_access(&mut self, host: usize, what: &str) {
        if self.last_use[host] > self.seen {
            let message = format!(
                "host {what} buffer {host} while stream operation {} may still use it \
                 (seen complete: [0, {}))",
                self.last_use[host] - 1,
                self.seen
            );
            self.violations.push(message);
        }
    }

    fn buffer_addr(&self, semantic: Semantic) -> (u64, u64) {
        let buffer = self.core.buffer(semantic).unwrap();
        (self.core.window().base + buffer.offset, buffer.size_bytes)
    }

    /// Runs queued operations until `[0, upto)` have run.
    fn run_to(&mut self, upto: usize) {
        while self.ran < upto {
            let (_, op) = self.queue.pop_front().expect("queued");
            match op {
                Op::ToDevice {
                    host,
                    offset,
                    addr,
                    len,
                } => {
                    for i in 0..len {
                        let byte = self.hosts[host][offset + i];
                        self.memory.insert(addr + i as u64, byte);
                    }
                }
                Op::Launch(graph) => self.run_graph(graph),
                Op::ToHost {
                    host,
                    offset,
                    addr,
                    len,
                } => {
                    for i in 0..len {
                        let byte = self.memory.get(&(addr + i as u64)).copied().unwrap_or(0);
                        self.hosts[host][offset + i] = byte;
                    }
                }
                Op::Record => {}
            }
            self.ran += 1;
        }
    }

    fn word(&self, addr: u64) -> i32 {
        let byte = |i: u64| self.memory.get(&(addr + i)).copied().unwrap_or(0);
        i32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)])
    }

    fn put_word(&mut self, addr: u64, value: i32) {
        for (i, byte) in value.to_le_bytes().into_iter().enumerate() {
            self.memory.insert(addr + i as u64, byte);
        }
    }

    /// The graph reads the decode slots and writes every completion word
    /// (`launch * 1000 + word index`) and the status (`-launch`).
    fn run_graph(&mut self, graph: usize) {
        self.launches_run += 1;
        let launch = self.launches_run;
        let (slots, slots_len) = self.buffer_addr(Semantic::DecodeSlots);
        let dtype = self.core.buffer(Semantic::DecodeSlots).unwrap().dtype;
        let width = if dtype == DType::DtypeI64 as i32 {
            8
        } else {
            4
        };
        // Little-endian: an I64's low word holds the slot.
        let read: Vec<i32> = (0..slots_len / width)
            .map(|i| self.word(slots + width * i))
            .collect();
        self.graph_inputs.push((graph, read));
        if self.core.takes_token_masks() {
            let (flags, flags_len) = self.buffer_addr(Semantic::SampleMasked);
            let (words, _) = self.buffer_addr(Semantic::SampleMask);
            let row_words = self.core.buffer(Semantic::SampleMask).unwrap().shape[1];
            let flags: Vec<i32> = (0..flags_len / 4)
                .map(|i| self.word(flags + 4 * i))
                .collect();
            let rows = (flags.iter().enumerate())
                .filter(|&(_, &flag)| flag == 1)
                .map(|(row, _)| {
                    let start = words + row as u64 * row_words * 4;
                    (0..row_words).map(|i| self.word(start + 4 * i)).collect()
                })
                .collect();
            self.mask_inputs.push((flags, rows));
        }
        let (records, records_len) = self.buffer_addr(Semantic::Completions);
        for i in 0..records_len / 4 {
            self.put_word(records + 4 * i, launch * 1000 + i as i32);
        }
        let (status, _) = self.buffer_addr(Semantic::MaintStatus);
        self.put_word(status, -launch);
    }

    fn marker_done(&mut self, marker: usize) -> bool {
        match self.markers[marker] {
            None => true,
            Some(at) if at < self.ran => {
                self.seen = self.seen.max(at + 1);
                true
            }
            Some(_) => false,
        }
    }
}

struct FakeHost {
    id: usize,
    state: Shared,
}

impl HostBuffer for FakeHost {
    fn capacity(&self) -> usize {
        self.state.borrow().hosts[self.id].len()
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut state = self.state.borrow_mut();
        state.host_access(self.id, "wrote");
        state.hosts[self.id][..bytes.len()].copy_from_slice(bytes);
    }

    fn read<R>(&self, read: impl FnOnce(&[u8]) -> R) -> R {
        self.state.borrow_mut().host_access(self.id, "read");
        read(&self.state.borrow().hosts[self.id])
    }
}

struct FakeMarker(usize);

struct FakeDevice {
    core: ValidCore,
    state: Shared,
}

impl FakeDevice {
    fn new(core: &ValidCore) -> (Self, Shared) {
        let state = Rc::new(RefCell::new(State {
            core: core.clone(),
            calls: Vec::new(),
            queue: VecDeque::new(),
            issued: 0,
            ran: 0,
            seen: 0,
            ready: false,
            fail_launch: false,
            memory: HashMap::new(),
            hosts: Vec::new(),
            last_use: Vec::new(),
            markers: Vec::new(),
            launches_run: 0,
            graph_inputs: Vec::new(),
            mask_inputs: Vec::new(),
            violations: Vec::new(),
        }));
        let device = Self {
            core: core.clone(),
            state: Rc::clone(&state),
        };
        (device, state)
    }

    /// Records a copy between host buffer `host` and device address `addr`
    /// (`make` names its direction) and queues it on the stream.
    fn transfer(
        &mut self,
        host: &FakeHost,
        offset: usize,
        addr: u64,
        len: usize,
        make: impl Fn(usize, usize, u64, usize) -> (Call, Op),
    ) -> Result<(), CudaError> {
        host_range(host, offset, len)?;
        let mut state = self.state.borrow_mut();
        let (call, op) = make(host.id, offset, addr, len);
        state.calls.push(call);
        let at = state.issue(op);
        state.touch(host.id, at);
        Ok(())
    }
}

fn host_range(host: &FakeHost, offset: usize, len: usize) -> Result<(), CudaError> {
    let size = host.capacity();
    if offset.checked_add(len).is_some_and(|end| end <= size) {
        Ok(())
    } else {
        Err(CudaError::HostRange { offset, len, size })
    }
}

impl LaunchDevice for FakeDevice {
    type Host = FakeHost;
    type Marker = FakeMarker;

    fn core(&self) -> &ValidCore {
        &self.core
    }

    fn host_buffer(&mut self, len: usize) -> Result<FakeHost, CudaError> {
        let mut state = self.state.borrow_mut();
        let id = state.hosts.len();
        state.hosts.push(vec![0; len]);
        state.last_use.push(0);
        state.calls.push(Call::HostBuffer { host: id, len });
        Ok(FakeHost {
            id,
            state: Rc::clone(&self.state),
        })
    }

    fn marker(&mut self) -> Result<FakeMarker, CudaError> {
        let mut state = self.state.borrow_mut();
        let id = state.markers.len();
        state.markers.push(None);
        state.calls.push(Call::Marker(id));
        Ok(FakeMarker(id))
    }

    fn copy_to_device(
        &mut self,
        addr: u64,
        source: &FakeHost,
        offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        self.transfer(source, offset, addr, len, |host, offset, addr, len| {
            let call = Call::ToDevice {
                host,
                offset,
                addr,
                len,
            };
            (
                call,
                Op::ToDevice {
                    host,
                    offset,
                    addr,
                    len,
                },
            )
        })
    }

    fn launch_graph(&mut self, graph: usize) -> Result<(), CudaError> {
        let mut state = self.state.borrow_mut();
        if state.fail_launch {
            return Err(CudaError::Driver {
                call: "cuGraphLaunch",
                code: 700,
                name: "CUDA_ERROR_ILLEGAL_ADDRESS".to_owned(),
            });
        }
        state.calls.push(Call::Launch(graph));
        state.issue(Op::Launch(graph));
        Ok(())
    }

    fn copy_to_host(
        &mut self,
        target: &mut FakeHost,
        offset: usize,
        addr: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        self.transfer(target, offset, addr, len, |host, offset, addr, len| {
            let call = Call::ToHost {
                host,
                offset,
                addr,
                len,
            };
            (
                call,
                Op::ToHost {
                    host,
                    offset,
                    addr,
                    len,
                },
            )
        })
    }

    fn record(&mut self, marker: &FakeMarker) -> Result<(), CudaError> {
        let mut state = self.state.borrow_mut();
        state.calls.push(Call::Record(marker.0));
        let at = state.issue(Op::Record);
        state.markers[marker.0] = Some(at);
        Ok(())
    }

    fn query(&mut self, marker: &FakeMarker) -> Result<bool, CudaError> {
        let mut state = self.state.borrow_mut();
        state.calls.push(Call::Query(marker.0));
        if let (true, Some(at)) = (state.ready, state.markers[marker.0]) {
            state.run_to(at + 1);
        }
        Ok(state.marker_done(marker.0))
    }

    fn wait(&mut self, marker: &FakeMarker) -> Result<(), CudaError> {
        let mut state = self.state.borrow_mut();
        state.calls.push(Call::Wait(marker.0));
        if let Some(at) = state.markers[marker.0] {
            state.run_to(at + 1);
        }
        assert!(state.marker_done(marker.0));
        Ok(())
    }
}

fn fixture() -> ValidCore {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    load_manifest(&dir).unwrap()
}

/// Absolute address and bytes of the buffer bound to `semantic`, straight
/// from the contract's bindings.
fn bound(core: &ValidCore, semantic: Semantic) -> (u64, u64) {
    let binding = (core.contract().bindings.iter())
        .find(|b| b.semantic == semantic as i32)
        .expect("bound");
    let buffer = core.buffer_named(&binding.buffer).expect("bound buffer");
    (core.window().base + buffer.offset, buffer.size_bytes)
}

/// The fixture (exported before token masks) with the mask buffers bound,
/// as a newer export lays them out: rows x ceil(vocab / 32) words and one
/// flag per row, after the last staging buffer.
fn with_token_masks(core: &ValidCore) -> ValidCore {
    let mut core = core.clone().into_core();
    let rows = u64::from(
        *core
            .contract
            .as_ref()
            .unwrap()
            .decode_capacities
            .iter()
            .max()
            .unwrap(),
    );
    let row_words = u64::from(core.contract.as_ref().unwrap().vocab_size).div_ceil(32);
    let staging =
        |role: i32| role == BufferRole::StagingInput as i32 || role == BufferRole::Output as i32;
    let mut end = (core.buffers.iter())
        .filter(|b| staging(b.role))
        .map(|b| b.offset + b.size_bytes)
        .max()
        .unwrap();
    for (name, semantic, shape) in [
        (
            "staging.sample_mask",
            Semantic::SampleMask,
            vec![rows, row_words],
        ),
        ("staging.sample_masked", Semantic::SampleMasked, vec![rows]),
    ] {
        let offset = end.div_ceil(256) * 256;
        let size_bytes = shape.iter().product::<u64>() * 4;
        let strides = if shape.len() == 2 {
            vec![shape[1], 1]
        } else {
            vec![1]
        };
        core.buffers.push(Buffer {
            name: name.to_owned(),
            role: BufferRole::StagingInput as i32,
            offset,
            size_bytes,
            dtype: DType::DtypeI32 as i32,
            shape,
            strides,
            initial_tensor: String::new(),
        });
        let contract = core.contract.as_mut().unwrap();
        contract.bindings.push(Binding {
            semantic: semantic as i32,
            buffer: name.to_owned(),
        });
        end = offset + size_bytes;
    }
    ValidCore::new(core).unwrap()
}

fn graph_position(core: &ValidCore, kind: GraphKind, capacity: u32) -> usize {
    (core.graphs().iter())
        .position(|g| g.kind == kind as i32 && g.capacity == capacity)
        .unwrap()
}

fn decode(slots: [u32; 4]) -> Launch {
    Launch {
        page_updates: Vec::new(),
        operation: Operation::Decode(Decode {
            capacity: 4,
            slots: slots.map(Slot).to_vec(),
            masks: Vec::new(),
        }),
    }
}

/// The records the fake graph wrote on its `launch`-th run, `rows` rows.
fn expected_records(core: &ValidCore, launch: i32, rows: usize) -> Vec<CompletionRecord> {
    let fields = &core.contract().completion_fields;
    let field = |name: &str| fields.iter().position(|f| f == name).unwrap();
    (0..rows)
        .map(|row| {
            let word = |name: &str| launch * 1000 + (row * fields.len() + field(name)) as i32;
            CompletionRecord {
                slot: word("slot"),
                token: word("token"),
                generated: word("generated"),
                consumed: word("consumed"),
                done: word("done"),
                valid: word("valid"),
            }
        })
        .collect()
}

/// The calls since construction (the ring's allocations dropped).
fn launch_calls(state: &Shared) -> Vec<Call> {
    let calls = state.borrow().calls.clone();
    let setup = 3 * MAX_IN_FLIGHT;
    assert!(calls.len() >= setup, "{calls:?}");
    calls[setup..].to_vec()
}

#[test]
fn the_ring_is_allocated_once_with_room_for_the_largest_launch() {
    let core = fixture();
    let staging = StagingLayout::new(core.view()).unwrap();
    let (device, state) = FakeDevice::new(&core);
    let _executor = GpuExecutor::new(device).unwrap();
    let calls = state.borrow().calls.clone();
    let output = staging.record_bytes(staging.max_rows()) + StagingLayout::STATUS_BYTES;
    let expected: Vec<Call> = (0..MAX_IN_FLIGHT)
        .flat_map(|slot| {
            [
                Call::HostBuffer {
                    host: 2 * slot,
                    len: staging.max_packed_bytes(),
                },
                Call::HostBuffer {
                    host: 2 * slot + 1,
                    len: output,
                },
                Call::Marker(slot),
            ]
        })
        .collect();
    assert_eq!(calls, expected);
}

#[test]
fn a_launch_copies_its_staging_then_launches_then_copies_the_records_back_then_records() {
    let core = fixture();
    let staging = StagingLayout::new(core.view()).unwrap();
    let (device, state) = FakeDevice::new(&core);
    let mut executor = GpuExecutor::new(device).unwrap();
    let launch = decode([2, 1, 0, 0]);
    let packed = staging.pack(&launch).unwrap();
    let ticket = executor.submit(&launch).unwrap();
    assert_eq!(ticket, Ticket(0));

    let (records, _) = bound(&core, Semantic::Completions);
    let fields = core.contract().completion_fields.len();
    let mut expected: Vec<Call> = (packed.writes.iter())
        .map(|w| Call::ToDevice {
            host: 0,
            offset: w.offset,
            addr: w.addr,
            len: w.len,
        })
        .collect();
    assert!(!expected.is_empty());
    expected.extend([
        Call::Launch(graph_position(&core, GraphKind::Decode, 4)),
        Call::ToHost {
            host: 1,
            offset: 0,
            addr: records,
            len: 4 * fields * 4,
        },
        Call::Record(0),
    ]);
    assert_eq!(launch_calls(&state), expected);
    // The staging copy covers the decode slots binding.
    let (slots, _) = bound(&core, Semantic::DecodeSlots);
    assert!(packed.writes.iter().any(|w| w.addr == slots));

    // Nothing ran yet: the host may not look.
    assert_eq!(executor.poll(ticket).unwrap(), None);
    state.borrow_mut().ready = true;
    let completion = executor.poll(ticket).unwrap().expect("complete");
    assert_eq!(completion.records, expected_records(&core, 1, 4));
    assert_eq!(completion.status, None);
    let state = state.borrow();
    assert_eq!(
        state.graph_inputs,
        vec![(
            graph_position(&core, GraphKind::Decode, 4),
            vec![2, 1, 0, 0]
        )]
    );
    assert!(state.violations.is_empty(), "{:?}", state.violations);
}

#[test]
fn a_maintenance_launch_copies_the_status_binding_right_after_its_records() {
    let core = fixture();
    let (device, state) = FakeDevice::new(&core);
    let mut executor = GpuExecutor::new(device).unwrap();
    let snapshot = Launch {
        page_updates: Vec::new(),
        operation: Operation::Snapshot(Snapshot {
            slot: Slot(3),
            row: SnapshotRow(1),
        }),
    };
    let ticket = executor.submit(&snapshot).unwrap();
    let (records, _) = bound(&core, Semantic::Completions);
    let (status, _) = bound(&core, Semantic::MaintStatus);
    let calls = launch_calls(&state);
    let tail = &calls[calls.len() - 4..];
    assert_eq!(
        tail,
        [
            Call::Launch(graph_position(&core, GraphKind::Snapshot, 1)),
            // No records for a snapshot; the status right after them.
            Call::ToHost {
                host: 1,
                offset: 0,
                addr: records,
                len: 0,
            },
            Call::ToHost {
                host: 1,
                offset: 0,
                addr: status,
                len: StagingLayout::STATUS_BYTES,
            },
            Call::Record(0),
        ]
    );
    assert!(calls[..calls.len() - 4]
        .iter()
        .all(|c| matches!(c, Call::ToDevice { host: 0, .. })));
    // `wait` blocks on the marker whatever the device's pace.
    let completion = executor.wait(ticket).unwrap();
    assert_eq!(completion.status, Some(-1));
    assert!(completion.records.is_empty());
    assert_eq!(state.borrow().calls.last(), Some(&Call::Wait(0)));

    // A resume has one record; a decode after it reads its status nowhere.
    let resume = Launch {
        page_updates: Vec::new(),
        operation: Operation::Resume(Resume {
            slot: Slot(2),
            mask: None,
        }),
    };
    let ticket = executor.submit(&resume).unwrap();
    let calls = launch_calls(&state);
    let fields = core.contract().completion_fields.len();
    assert_eq!(
        calls[calls.len() - 2..],
        [
            Call::ToHost {
                host: 3,
                offset: 0,
                addr: records,
                len: fields * 4,
            },
            Call::Record(1),
        ]
    );
    let completion = executor.wait(ticket).unwrap();
    assert_eq!(completion.records, expected_records(&core, 2, 1));
    assert_eq!(completion.status, None);
    assert!(state.borrow().violations.is_empty());
}

#[test]
fn a_ring_slot_is_reused_only_after_its_marker_was_seen_complete() {
    let core = fixture();
    let (device, state) = FakeDevice::new(&core);
    let mut executor = GpuExecutor::new(device).unwrap();
    // Fill the ring; the device runs nothing yet.
    let tickets: Vec<Ticket> = (0..MAX_IN_FLIGHT as u32)
        .map(|i| executor.submit(&decode([i, 0, 0, 0])).unwrap())
        .collect();
    let calls_before = state.borrow().calls.len();
    let err = executor.submit(&decode([9, 0, 0, 0])).unwrap_err();
    assert!(
        matches!(
            err,
            ExecutionError::Device {
                operation: "submit",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        state.borrow().calls.len(),
        calls_before,
        "a refused submit touches nothing"
    );
    // Completions come back oldest first only.
    assert!(matches!(
        executor.poll(tickets[1]),
        Err(ExecutionError::UnknownTicket { ticket: 1 })
    ));
    assert_eq!(executor.poll(tickets[0]).unwrap(), None);
    assert!(matches!(
        executor.submit(&decode([9, 0, 0, 0])),
        Err(ExecutionError::Device { .. })
    ));

    // The oldest completes: its slot (buffers 0 and 1, marker 0) is free.
    state.borrow_mut().ready = true;
    let first = executor.poll(tickets[0]).unwrap().expect("complete");
    assert_eq!(first.records, expected_records(&core, 1, 4));
    state.borrow_mut().ready = false;
    let start = state.borrow().calls.len();
    let reused = executor.submit(&decode([9, 0, 0, 0])).unwrap();
    assert_eq!(reused, Ticket(MAX_IN_FLIGHT as u64));
    let calls = state.borrow().calls[start..].to_vec();
    assert!(calls.iter().all(|c| match c {
        Call::ToDevice { host, .. } => *host == 0,
        Call::ToHost { host, .. } => *host == 1,
        Call::Record(marker) => *marker == 0,
        Call::Launch(_) => true,
        other => panic!("unexpected {other:?}"),
    }));

    // Drain in order; every launch read its own inputs.
    state.borrow_mut().ready = true;
    for (i, &ticket) in tickets[1..].iter().chain([&reused]).enumerate() {
        let completion = executor.poll(ticket).unwrap().expect("complete");
        assert_eq!(completion.records, expected_records(&core, i as i32 + 2, 4));
    }
    let state = state.borrow();
    let slots: Vec<i32> = state.graph_inputs.iter().map(|(_, s)| s[0]).collect();
    let mut expected: Vec<i32> = (0..MAX_IN_FLIGHT as i32).collect();
    expected.push(9);
    assert_eq!(slots, expected);
    assert!(state.violations.is_empty(), "{:?}", state.violations);
}

#[test]
fn draining_waits_for_the_newest_launch_and_retrieves_nothing() {
    let core = fixture();
    let (device, state) = FakeDevice::new(&core);
    let mut executor = GpuExecutor::new(device).unwrap();
    executor.drain().unwrap(); // nothing in flight: nothing waited for
    assert!(!state
        .borrow()
        .calls
        .iter()
        .any(|c| matches!(c, Call::Wait(_))));
    let tickets: Vec<Ticket> = (0..3)
        .map(|i| executor.submit(&decode([i, 0, 0, 0])).unwrap())
        .collect();
    executor.drain().unwrap();
    // One wait, on the newest launch's marker (slot 2): the stream ran them all.
    let waits: Vec<Call> = (state.borrow().calls.iter())
        .filter(|c| matches!(c, Call::Wait(_)))
        .cloned()
        .collect();
    assert_eq!(waits, [Call::Wait(2)]);
    // Nothing was retrieved: the completions still come back, oldest first.
    for (i, &ticket) in tickets.iter().enumerate() {
        let completion = executor.poll(ticket).unwrap().expect("complete");
        assert_eq!(completion.records, expected_records(&core, i as i32 + 1, 4));
    }
}

/// The fake catches the misuse the executor must avoid: touching a slot's
/// host bytes before its marker was seen complete.
#[test]
fn the_fake_flags_host_access_before_the_marker_completed() {
    let core = fixture();
    let (mut device, state) = FakeDevice::new(&core);
    let mut input = device.host_buffer(16).unwrap();
    let marker = device.marker().unwrap();
    device.copy_to_device(0x10, &input, 0, 4).unwrap();
    device.record(&marker).unwrap();
    input.write(&[1, 2, 3, 4]);
    assert_eq!(state.borrow().violations.len(), 1);
    device.wait(&marker).unwrap();
    input.write(&[5, 6, 7, 8]);
    assert_eq!(state.borrow().violations.len(), 1);
}

#[test]
fn a_failed_launch_is_a_device_error_naming_the_step() {
    let core = fixture();
    let (device, state) = FakeDevice::new(&core);
    let mut executor = GpuExecutor::new(device).unwrap();
    state.borrow_mut().fail_launch = true;
    let err = executor.submit(&decode([1, 0, 0, 0])).unwrap_err();
    assert!(
        matches!(
            err,
            ExecutionError::Device {
                operation: "graph launch",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{err}"
    );
}

/// The stale-staging hazard of constrained decoding: with two steps in
/// flight, each lane's mask differing between them, every graph must read
/// its own step's masks (the host packs the next step while the previous
/// one's copies have not run yet).
#[test]
fn two_steps_in_flight_each_read_their_own_masks() {
    let core = with_token_masks(&fixture());
    let row_words = core.buffer(Semantic::SampleMask).unwrap().shape[1] as usize;
    let (device, state) = FakeDevice::new(&core);
    let mut executor = GpuExecutor::new(device).unwrap();
    assert!(executor.applies_masks());
    let mask = |seed: u32| -> Vec<u32> {
        (0..row_words as u32)
            .map(|i| seed.wrapping_mul(0x9E37_79B9).rotate_left(i))
            .collect()
    };
    let step = |masks: [Option<Vec<u32>>; 4]| Launch {
        page_updates: Vec::new(),
        operation: Operation::Decode(Decode {
            capacity: 4,
            slots: [1, 2, 3, 0].map(Slot).to_vec(),
            masks: masks.to_vec(),
        }),
    };
    let first = step([Some(mask(1)), None, Some(mask(3)), None]);
    let second = step([Some(mask(11)), Some(mask(12)), None, None]);
    let third = step([None, None, None, None]);
    let tickets = [&first, &second, &third].map(|launch| executor.submit(launch).unwrap());
    state.borrow_mut().ready = true;
    for ticket in tickets {
        executor.poll(ticket).unwrap().expect("complete");
    }
    let state = state.borrow();
    let words = |seed| mask(seed).into_iter().map(|w| w as i32).collect::<Vec<_>>();
    let flags = |f: [i32; 4]| f.to_vec();
    assert_eq!(
        state.mask_inputs,
        vec![
            (flags([1, 0, 1, 0]), vec![words(1), words(3)]),
            (flags([1, 1, 0, 0]), vec![words(11), words(12)]),
            (flags([0, 0, 0, 0]), vec![]),
        ]
    );
    assert!(state.violations.is_empty(), "{:?}", state.violations);
}

#[test]
fn a_core_exported_before_token_masks_applies_none() {
    let (device, _) = FakeDevice::new(&fixture());
    assert!(!GpuExecutor::new(device).unwrap().applies_masks());
}
