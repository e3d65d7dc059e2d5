//! The host side of the staging contract: where each semantic value lives
//! in the window, and how a [`Launch`] becomes the bytes to copy there.
//!
//! Everything here derives from the core's semantic bindings (buffer,
//! dtype, shape) and its completion-field names; nothing is model-specific.
//! Graphs of every capacity read prefixes of the same staging buffers, so
//! one layout packs every operation. Element order inside the two packed
//! parameter vectors is part of the semantic's definition:
//!
//! - `SEMANTIC_ADMIT_INT`: at the positions of the schema's `AdmitIntField`;
//! - `SEMANTIC_ADMIT_FLOAT`: at the positions of `AdmitFloatField`.
//!
//! Token masks (a core that binds `SEMANTIC_SAMPLE_MASK` and
//! `SEMANTIC_SAMPLE_MASKED`): every decode, prefill-chunk and resume launch
//! writes each of its rows' flags, and the words of the rows it constrains;
//! an unconstrained row's stale words are never read. A launch's bytes live
//! in its own pinned slot of the executor's ring until its copies have run,
//! so a mask written for one step never reaches another.

use std::collections::HashMap;

use crate::core::proto::{AdmitFloatField, AdmitIntField, Buffer, DType, GraphKind, Semantic};
use crate::core::RankView;
use crate::prefix::SnapshotRow;
use crate::scheduler::{
    Completion, CompletionRecord, Launch, Operation, PageTableUpdate, SamplingParams, Slot,
};

/// Why a core's staging contract cannot be packed, or a launch does not fit
/// it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StagingError {
    /// A bound buffer has a dtype or shape the semantic cannot use.
    #[error("{semantic:?} is bound to {buffer:?} of {dtype:?} {shape:?}: {reason}")]
    Binding {
        /// The semantic value.
        semantic: Semantic,
        /// The bound buffer.
        buffer: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<u64>,
        /// What the semantic needs instead.
        reason: &'static str,
    },
    /// The completion fields lack one the records need.
    #[error("the contract's completion fields lack {0:?}")]
    MissingField(&'static str),
    /// No graph is recorded for an operation.
    #[error("no {kind:?} graph of capacity {capacity}")]
    NoGraph {
        /// The graph kind.
        kind: GraphKind,
        /// The capacity.
        capacity: u32,
    },
    /// A launch holds more values than a staging buffer.
    #[error("{what}: {len} values do not fit {capacity}")]
    TooLong {
        /// Which value.
        what: &'static str,
        /// Values the launch holds.
        len: usize,
        /// Values the buffer holds.
        capacity: u64,
    },
    /// A launch carries token masks, and the core's sampling takes none.
    #[error("this core's sampling graphs take no token mask")]
    NoMasks,
    /// A value does not fit the buffer's integer type.
    #[error("{what}: {value} does not fit {dtype:?}")]
    OutOfRange {
        /// Which value.
        what: &'static str,
        /// The value.
        value: i128,
        /// The buffer's dtype.
        dtype: DType,
    },
}

/// Where one semantic value lives: absolute address, element type and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Absolute device address of element 0.
    pub addr: u64,
    /// Element type.
    pub dtype: DType,
    /// Elements in the buffer.
    pub elements: u64,
}

impl View {
    fn element_bytes(self) -> u64 {
        dtype_bytes(self.dtype)
    }
}

fn dtype_bytes(dtype: DType) -> u64 {
    match dtype {
        DType::DtypeI64 => 8,
        DType::DtypeBf16 | DType::DtypeF16 => 2,
        DType::DtypeU8 => 1,
        _ => 4,
    }
}

/// One host-to-device copy of a packed launch: `len` bytes from `offset` of
/// the packed bytes to `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    /// Destination address.
    pub addr: u64,
    /// Offset into [`Packed::bytes`].
    pub offset: usize,
    /// Bytes to copy.
    pub len: usize,
}

/// A launch packed for the device: the copies to make, in order, then the
/// graph to replay and the records to read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packed {
    /// The source bytes of every write, back to back.
    pub bytes: Vec<u8>,
    /// The copies, in submission order (page tables first).
    pub writes: Vec<Write>,
    /// Position of the graph in the manifest.
    pub graph: usize,
    /// Completion records the graph writes.
    pub rows: usize,
    /// Whether the graph writes a maintenance status to read back.
    pub status: bool,
}

impl Packed {
    /// Appends one copy to `addr` whose bytes `fill` appends to [`Self::bytes`].
    fn append<E>(
        &mut self,
        addr: u64,
        fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let offset = self.bytes.len();
        fill(&mut self.bytes)?;
        self.writes.push(Write {
            addr,
            offset,
            len: self.bytes.len() - offset,
        });
        Ok(())
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.writes.clear();
        self.graph = 0;
        self.rows = 0;
        self.status = false;
    }
}

/// Positions of the completion fields the scheduler reads, in a record row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fields {
    count: usize,
    slot: usize,
    token: usize,
    generated: usize,
    consumed: usize,
    done: usize,
    valid: usize,
}

/// Where a core's sampling graphs read token masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Masks {
    /// The packed masks, `rows` x `words` I32.
    words: View,
    /// Words per row.
    row_words: u64,
    /// The per-row flags, at least `rows` I32.
    flags: View,
}

/// The resolved staging contract of a core.
#[derive(Debug, Clone)]
pub struct StagingLayout {
    views: HashMap<Semantic, View>,
    masks: Option<Masks>,
    page_table: View,
    max_pages: u64,
    completions: View,
    status: View,
    fields: Fields,
    graphs: HashMap<(GraphKind, u32), usize>,
}

/// The semantic values a launch writes, with the element kinds they need.
const INTEGER_INPUTS: [Semantic; 14] = [
    Semantic::DecodeSlots,
    Semantic::ChunkSlot,
    Semantic::ChunkTokens,
    Semantic::ChunkLen,
    Semantic::ChunkSample,
    Semantic::AdmitSlot,
    Semantic::AdmitTokens,
    Semantic::AdmitLen,
    Semantic::AdmitConsumed,
    Semantic::AdmitInt,
    Semantic::AdmitSeed,
    Semantic::MaintSlot,
    Semantic::MaintRow,
    Semantic::MaintExpect,
];
const ADMIT_INT_VALUES: u64 = 2;
const ADMIT_FLOAT_VALUES: u64 = 6;
const MASK_BITS: u64 = 32;

fn is_integer(dtype: DType) -> bool {
    matches!(dtype, DType::DtypeI32 | DType::DtypeI64)
}

fn binding_error(semantic: Semantic, buffer: &Buffer, reason: &'static str) -> StagingError {
    StagingError::Binding {
        semantic,
        buffer: buffer.name.clone(),
        dtype: DType::try_from(buffer.dtype).unwrap_or_default(),
        shape: buffer.shape.clone(),
        reason,
    }
}

impl StagingLayout {
    /// Resolves `core`'s bindings (one rank's: its window and buffers) and
    /// checks each has the dtype and shape its semantic needs.
    pub fn new(core: RankView<'_>) -> Result<Self, StagingError> {
        let base = core.window().base;
        let resolve = |semantic: Semantic| -> Result<(&Buffer, View), StagingError> {
            // Validation binds every semantic value to an existing buffer.
            let buffer = core
                .buffer(semantic)
                .expect("a validated core binds every semantic value");
            let dtype = DType::try_from(buffer.dtype).unwrap_or_default();
            let elements = buffer.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
            let elements = elements
                .filter(|&n| n * dtype_bytes(dtype) <= buffer.size_bytes)
                .ok_or_else(|| binding_error(semantic, buffer, "its shape exceeds its bytes"))?;
            let view = View {
                addr: base + buffer.offset,
                dtype,
                elements,
            };
            Ok((buffer, view))
        };
        let mut views = HashMap::new();
        for semantic in INTEGER_INPUTS.into_iter().chain([Semantic::ResumeSlot]) {
            let (buffer, view) = resolve(semantic)?;
            if !is_integer(view.dtype) {
                return Err(binding_error(semantic, buffer, "an I32 or I64 buffer"));
            }
            if view.elements == 0 {
                return Err(binding_error(semantic, buffer, "at least one element"));
            }
            views.insert(semantic, view);
        }
        let (buffer, admit_int) = resolve(Semantic::AdmitInt)?;
        if admit_int.elements < ADMIT_INT_VALUES {
            return Err(binding_error(Semantic::AdmitInt, buffer, "two elements"));
        }
        let (buffer, admit_float) = resolve(Semantic::AdmitFloat)?;
        if admit_float.dtype != DType::DtypeF32 || admit_float.elements < ADMIT_FLOAT_VALUES {
            return Err(binding_error(
                Semantic::AdmitFloat,
                buffer,
                "an F32 buffer of six elements",
            ));
        }
        views.insert(Semantic::AdmitFloat, admit_float);

        let (buffer, page_table) = resolve(Semantic::PageTable)?;
        if page_table.dtype != DType::DtypeI32 || buffer.shape.len() != 2 {
            return Err(binding_error(
                Semantic::PageTable,
                buffer,
                "an I32 [slots, pages] buffer",
            ));
        }
        let max_pages = buffer.shape[1];

        let fields = fields(&core.contract().completion_fields)?;
        let (buffer, completions) = resolve(Semantic::Completions)?;
        if completions.dtype != DType::DtypeI32
            || buffer.shape.len() != 2
            || buffer.shape[1] != fields.count as u64
        {
            return Err(binding_error(
                Semantic::Completions,
                buffer,
                "an I32 [rows, completion fields] buffer",
            ));
        }
        let (buffer, status) = resolve(Semantic::MaintStatus)?;
        if status.dtype != DType::DtypeI32 || status.elements == 0 {
            return Err(binding_error(
                Semantic::MaintStatus,
                buffer,
                "an I32 buffer of at least one element",
            ));
        }
        let masks = if core.takes_token_masks() {
            let (buffer, words) = resolve(Semantic::SampleMask)?;
            let vocab = u64::from(core.contract().vocab_size);
            let row_words = vocab.div_ceil(MASK_BITS);
            let rows = buffer.shape.first().copied().unwrap_or(0);
            if words.dtype != DType::DtypeI32
                || buffer.shape.len() != 2
                || buffer.shape[1] != row_words
                || rows == 0
            {
                return Err(binding_error(
                    Semantic::SampleMask,
                    buffer,
                    "an I32 [rows, ceil(vocab / 32)] buffer",
                ));
            }
            let (buffer, flags) = resolve(Semantic::SampleMasked)?;
            if flags.dtype != DType::DtypeI32 || flags.elements < rows {
                return Err(binding_error(
                    Semantic::SampleMasked,
                    buffer,
                    "an I32 buffer of one flag per mask row",
                ));
            }
            views.insert(Semantic::SampleMask, words);
            views.insert(Semantic::SampleMasked, flags);
            Some(Masks {
                words,
                row_words,
                flags,
            })
        } else {
            None
        };
        let mut graphs = HashMap::new();
        for (index, graph) in core.graphs().iter().enumerate() {
            if let Ok(kind) = GraphKind::try_from(graph.kind) {
                graphs.insert((kind, graph.capacity), index);
            }
        }
        Ok(Self {
            views,
            masks,
            page_table,
            max_pages,
            completions,
            status,
            fields,
            graphs,
        })
    }

    /// The largest packed launch, in bytes: every input buffer plus the whole
    /// page table (an upper bound for pinned staging).
    pub fn max_packed_bytes(&self) -> usize {
        let inputs: u64 = (self.views.values())
            .map(|view| view.elements * view.element_bytes())
            .sum();
        (inputs + self.page_table.elements * 4) as usize
    }

    /// Whether the core's sampling graphs take token masks.
    pub fn takes_masks(&self) -> bool {
        self.masks.is_some()
    }

    /// Bytes of `rows` completion records.
    pub fn record_bytes(&self, rows: usize) -> usize {
        rows * self.fields.count * 4
    }

    /// Address of the completion records.
    pub fn completions_addr(&self) -> u64 {
        self.completions.addr
    }

    /// Address of the maintenance status a snapshot or restore writes.
    pub fn status_addr(&self) -> u64 {
        self.status.addr
    }

    /// Bytes of the maintenance status.
    pub const STATUS_BYTES: usize = 4;

    /// Completion rows the records buffer holds.
    pub fn max_rows(&self) -> usize {
        (self.completions.elements / self.fields.count as u64) as usize
    }

    /// The copies, graph and record count of `launch`.
    pub fn pack(&self, launch: &Launch) -> Result<Packed, StagingError> {
        let mut packed = Packed::default();
        self.pack_into(launch, &mut packed)?;
        Ok(packed)
    }

    /// [`Self::pack`] into `packed`, reusing its storage (the executor packs
    /// every step into one buffer, allocating nothing once it has grown).
    pub fn pack_into(&self, launch: &Launch, packed: &mut Packed) -> Result<(), StagingError> {
        packed.clear();
        let packed = &mut *packed;
        for update in &launch.page_updates {
            self.pack_page_update(packed, update)?;
        }
        let (kind, capacity) = match &launch.operation {
            Operation::Admit(admit) => {
                let one = |value: u32| std::iter::once(i128::from(value));
                self.put(packed, Semantic::AdmitSlot, "admit slot", one(admit.slot.0))?;
                let tokens = admit.prompt.iter().map(|&t| i128::from(t));
                self.put(packed, Semantic::AdmitTokens, "prompt", tokens)?;
                let len = one(len_u32(admit.prompt.len()));
                self.put(packed, Semantic::AdmitLen, "prompt length", len)?;
                self.put(
                    packed,
                    Semantic::AdmitConsumed,
                    "consumed",
                    one(admit.consumed),
                )?;
                let mut ints = [0i128; ADMIT_INT_VALUES as usize];
                ints[AdmitIntField::AdmitIntTopK as usize] = i128::from(admit.sampling.top_k);
                ints[AdmitIntField::AdmitIntMaxNewTokens as usize] =
                    i128::from(admit.max_new_tokens);
                self.put(
                    packed,
                    Semantic::AdmitInt,
                    "admit integers",
                    ints.into_iter(),
                )?;
                self.put_floats(packed, &admit.sampling);
                // The seed is a 64-bit key: its bits, whatever the sign.
                let seed = std::iter::once(i128::from(admit.seed as i64));
                self.put(packed, Semantic::AdmitSeed, "seed", seed)?;
                (GraphKind::Admit, 1)
            }
            Operation::PrefillChunk(chunk) => {
                let one = |value: u32| std::iter::once(i128::from(value));
                self.put(packed, Semantic::ChunkSlot, "chunk slot", one(chunk.slot.0))?;
                let tokens = chunk.tokens.iter().map(|&t| i128::from(t));
                self.put(packed, Semantic::ChunkTokens, "chunk", tokens)?;
                let len = one(len_u32(chunk.tokens.len()));
                self.put(packed, Semantic::ChunkLen, "chunk length", len)?;
                let sample = one(u32::from(chunk.samples));
                self.put(packed, Semantic::ChunkSample, "chunk sample", sample)?;
                self.put_masks(packed, std::slice::from_ref(&chunk.mask), 1)?;
                (GraphKind::Prefill, chunk.capacity)
            }
            Operation::Decode(decode) => {
                let slots = decode.slots.iter().map(|s| i128::from(s.0));
                self.put(packed, Semantic::DecodeSlots, "decode slots", slots)?;
                let rows = decode.slots.len().max(decode.masks.len());
                self.put_masks(packed, &decode.masks, rows)?;
                (GraphKind::Decode, decode.capacity)
            }
            Operation::Resume(resume) => {
                let slot = std::iter::once(i128::from(resume.slot.0));
                self.put(packed, Semantic::ResumeSlot, "resume slot", slot)?;
                self.put_masks(packed, std::slice::from_ref(&resume.mask), 1)?;
                (GraphKind::Resume, 1)
            }
            Operation::Snapshot(snapshot) => {
                self.put_maintenance(packed, snapshot.slot, snapshot.row, None)?;
                (GraphKind::Snapshot, 1)
            }
            Operation::Restore(restore) => {
                self.put_maintenance(packed, restore.slot, restore.row, Some(restore.expect))?;
                (GraphKind::Restore, 1)
            }
        };
        packed.graph = *self
            .graphs
            .get(&(kind, capacity))
            .ok_or(StagingError::NoGraph { kind, capacity })?;
        packed.rows = launch.operation.record_rows();
        packed.status = launch.operation.reports_status();
        if packed.rows > self.max_rows() {
            return Err(StagingError::TooLong {
                what: "completion records",
                len: packed.rows,
                capacity: self.max_rows() as u64,
            });
        }
        Ok(())
    }

    /// Completion records from the bytes the graph wrote (`rows` rows),
    /// and the maintenance status from the [`Self::STATUS_BYTES`] after them
    /// when `status`.
    pub fn completion(&self, bytes: &[u8], rows: usize, status: bool) -> Completion {
        let mut completion = self.records(bytes, rows);
        if status {
            let at = self.record_bytes(rows);
            completion.status = bytes
                .get(at..at + Self::STATUS_BYTES)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        }
        completion
    }

    /// Completion records from the bytes the graph wrote (`rows` rows).
    pub fn records(&self, bytes: &[u8], rows: usize) -> Completion {
        let word = |row: usize, field: usize| {
            let at = (row * self.fields.count + field) * 4;
            bytes
                .get(at..at + 4)
                .map_or(0, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let f = self.fields;
        let records = (0..rows)
            .map(|row| CompletionRecord {
                slot: word(row, f.slot),
                token: word(row, f.token),
                generated: word(row, f.generated),
                consumed: word(row, f.consumed),
                done: word(row, f.done),
                valid: word(row, f.valid),
            })
            .collect();
        Completion {
            records,
            status: None,
        }
    }

    fn pack_page_update(
        &self,
        packed: &mut Packed,
        update: &PageTableUpdate,
    ) -> Result<(), StagingError> {
        let Slot(slot) = update.slot;
        let first = u64::from(update.first);
        let end = first + update.pages.len() as u64;
        if end > self.max_pages {
            return Err(StagingError::TooLong {
                what: "page-table row",
                len: end as usize,
                capacity: self.max_pages,
            });
        }
        let start = u64::from(slot) * self.max_pages + first;
        if start + update.pages.len() as u64 > self.page_table.elements {
            return Err(StagingError::OutOfRange {
                what: "page-table slot",
                value: i128::from(slot),
                dtype: DType::DtypeI32,
            });
        }
        packed.append(self.page_table.addr + start * 4, |bytes| {
            for page in &update.pages {
                let value = i32::try_from(page.0).map_err(|_| StagingError::OutOfRange {
                    what: "page",
                    value: i128::from(page.0),
                    dtype: DType::DtypeI32,
                })?;
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            Ok(())
        })
    }

    fn put(
        &self,
        packed: &mut Packed,
        semantic: Semantic,
        what: &'static str,
        values: impl ExactSizeIterator<Item = i128>,
    ) -> Result<(), StagingError> {
        let view = self.views[&semantic];
        if values.len() as u64 > view.elements {
            return Err(StagingError::TooLong {
                what,
                len: values.len(),
                capacity: view.elements,
            });
        }
        packed.append(view.addr, |bytes| {
            for value in values {
                let out_of_range = || StagingError::OutOfRange {
                    what,
                    value,
                    dtype: view.dtype,
                };
                match view.dtype {
                    DType::DtypeI64 => {
                        let v = i64::try_from(value).map_err(|_| out_of_range())?;
                        bytes.extend_from_slice(&v.to_le_bytes());
                    }
                    _ => {
                        let v = i32::try_from(value).map_err(|_| out_of_range())?;
                        bytes.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Ok(())
        })
    }

    /// The token masks of a sampling launch's first `rows` rows: each row's
    /// flag (1 where `masks` holds a mask for it), then each masked row's
    /// words. Nothing on a core without masks, where a mask is an error.
    fn put_masks(
        &self,
        packed: &mut Packed,
        masks: &[Option<Vec<u32>>],
        rows: usize,
    ) -> Result<(), StagingError> {
        let Some(layout) = self.masks else {
            return match masks.iter().any(Option::is_some) {
                true => Err(StagingError::NoMasks),
                false => Ok(()),
            };
        };
        let flags = (0..rows).map(|row| i128::from(matches!(masks.get(row), Some(Some(_)))));
        self.put(packed, Semantic::SampleMasked, "mask flags", flags)?;
        let row_bytes = layout.row_words * 4;
        for (row, mask) in masks.iter().enumerate() {
            let Some(mask) = mask else { continue };
            if mask.len() as u64 != layout.row_words {
                return Err(StagingError::TooLong {
                    what: "token mask words",
                    len: mask.len(),
                    capacity: layout.row_words,
                });
            }
            if (row as u64 + 1) * layout.row_words > layout.words.elements {
                return Err(StagingError::TooLong {
                    what: "token mask rows",
                    len: row + 1,
                    capacity: layout.words.elements / layout.row_words,
                });
            }
            let addr = layout.words.addr + row as u64 * row_bytes;
            let Ok(()) = packed.append::<std::convert::Infallible>(addr, |bytes| {
                bytes.extend(mask.iter().flat_map(|word| word.to_le_bytes()));
                Ok(())
            });
        }
        Ok(())
    }

    /// The maintenance slot, row and (for a restore) expected consumed count.
    fn put_maintenance(
        &self,
        packed: &mut Packed,
        slot: Slot,
        row: SnapshotRow,
        expect: Option<u32>,
    ) -> Result<(), StagingError> {
        let one = |value: u32| std::iter::once(i128::from(value));
        self.put(packed, Semantic::MaintSlot, "maintenance slot", one(slot.0))?;
        self.put(packed, Semantic::MaintRow, "snapshot row", one(row.0))?;
        if let Some(expect) = expect {
            self.put(
                packed,
                Semantic::MaintExpect,
                "expected consumed",
                one(expect),
            )?;
        }
        Ok(())
    }

    fn put_floats(&self, packed: &mut Packed, s: &SamplingParams) {
        let view = self.views[&Semantic::AdmitFloat];
        let mut values = [0f32; ADMIT_FLOAT_VALUES as usize];
        for (field, value) in [
            (AdmitFloatField::AdmitFloatTemperature, s.temperature),
            (AdmitFloatField::AdmitFloatTopP, s.top_p),
            (AdmitFloatField::AdmitFloatMinP, s.min_p),
            (
                AdmitFloatField::AdmitFloatRepetitionPenalty,
                s.repetition_penalty,
            ),
            (
                AdmitFloatField::AdmitFloatPresencePenalty,
                s.presence_penalty,
            ),
            (
                AdmitFloatField::AdmitFloatFrequencyPenalty,
                s.frequency_penalty,
            ),
        ] {
            values[field as usize] = value;
        }
        let Ok(()) = packed.append::<std::convert::Infallible>(view.addr, |bytes| {
            bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            Ok(())
        });
    }
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn fields(names: &[String]) -> Result<Fields, StagingError> {
    let find = |name: &'static str| {
        names
            .iter()
            .position(|n| n == name)
            .ok_or(StagingError::MissingField(name))
    };
    Ok(Fields {
        count: names.len(),
        slot: find("slot")?,
        token: find("token")?,
        generated: find("generated")?,
        consumed: find("consumed")?,
        done: find("done")?,
        valid: find("valid")?,
    })
}

#[cfg(test)]
mod tests;
