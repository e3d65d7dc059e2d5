use super::*;
use crate::core::proto::{BufferRole, Core};
use crate::core::sample::{tiny_core, SAMPLE_BASE};
use crate::prefix::SnapshotRow;
use crate::scheduler::{Admit, Decode, Page, PrefillChunk, Restore, Resume, Snapshot};

const FIELDS: [&str; 6] = ["slot", "token", "generated", "consumed", "done", "valid"];

/// The sample core with the serving contract's completion records.
fn core() -> Core {
    let mut core = tiny_core();
    let contract = core.contract.as_mut().unwrap();
    contract.completion_fields = FIELDS.map(str::to_owned).to_vec();
    // Six fields no longer fit the sample's buffer: move it to the end of the
    // staging region (18..20 MiB), clear of every other buffer.
    let completions = buffer_mut(&mut core, "staging.completions");
    completions.shape = vec![4, 6];
    completions.strides = vec![6, 1];
    completions.size_bytes = 4 * 6 * 4;
    completions.offset = (20 << 20) - 4096;
    core
}

fn buffer_mut<'c>(core: &'c mut Core, name: &str) -> &'c mut Buffer {
    core.buffers.iter_mut().find(|b| b.name == name).unwrap()
}

fn layout(core: Core) -> Result<StagingLayout, StagingError> {
    StagingLayout::new(crate::core::ValidCore::new(core).unwrap().view())
}

fn addr_of(core: &Core, name: &str) -> u64 {
    SAMPLE_BASE + core.buffers.iter().find(|b| b.name == name).unwrap().offset
}

/// A launch of `operation` with no page-table updates.
fn launch(operation: Operation) -> Launch {
    Launch {
        page_updates: Vec::new(),
        operation,
    }
}

fn words(packed: &Packed, write: &Write) -> Vec<i32> {
    packed.bytes[write.offset..write.offset + write.len]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn graph_position(core: &Core, kind: GraphKind, capacity: u32) -> usize {
    (core.graphs.iter())
        .position(|g| g.kind == kind as i32 && g.capacity == capacity)
        .unwrap()
}

#[test]
fn a_decode_packs_its_slots_and_page_updates_in_order() {
    let core = core();
    let staging = layout(core.clone()).unwrap();
    let launch = Launch {
        page_updates: vec![PageTableUpdate {
            slot: Slot(2),
            first: 3,
            pages: vec![Page(5), Page(6)],
        }],
        operation: Operation::Decode(Decode {
            capacity: 4,
            slots: vec![Slot(2), Slot(1), Slot::NULL, Slot::NULL],
            masks: Vec::new(),
        }),
    };
    let packed = staging.pack(&launch).unwrap();
    assert_eq!(packed.writes.len(), 3);
    let table = addr_of(&core, "state.page_table");
    let max_pages = core
        .buffers
        .iter()
        .find(|b| b.name == "state.page_table")
        .unwrap()
        .shape[1];
    assert_eq!(packed.writes[0].addr, table + (2 * max_pages + 3) * 4);
    assert_eq!(words(&packed, &packed.writes[0]), vec![5, 6]);
    assert_eq!(
        packed.writes[1].addr,
        addr_of(&core, "staging.decode_slots")
    );
    assert_eq!(words(&packed, &packed.writes[1]), vec![2, 1, 0, 0]);
    // No row is constrained: every row's mask flag is cleared.
    assert_eq!(
        packed.writes[2].addr,
        addr_of(&core, "staging.sample_masked")
    );
    assert_eq!(words(&packed, &packed.writes[2]), vec![0, 0, 0, 0]);
    assert_eq!(packed.graph, graph_position(&core, GraphKind::Decode, 4));
    assert_eq!(packed.rows, 4);
}

/// The sample core's mask rows: 256 tokens, 8 words.
const MASK_WORDS: usize = 8;

fn mask(seed: u32) -> Vec<u32> {
    (0..MASK_WORDS as u32)
        .map(|i| seed.wrapping_mul(0x9E37_79B9) ^ i)
        .collect()
}

#[test]
fn a_constrained_decode_writes_every_flag_and_only_the_masked_rows_words() {
    let core = core();
    let staging = layout(core.clone()).unwrap();
    assert!(staging.takes_masks());
    let decode = launch(Operation::Decode(Decode {
        capacity: 4,
        slots: vec![Slot(2), Slot(1), Slot(3), Slot::NULL],
        masks: vec![None, Some(mask(1)), Some(mask(2)), None],
    }));
    let packed = staging.pack(&decode).unwrap();
    let flags = addr_of(&core, "staging.sample_masked");
    let rows = addr_of(&core, "staging.sample_mask");
    let row_bytes = (MASK_WORDS * 4) as u64;
    let by_addr: HashMap<u64, &Write> = packed.writes.iter().map(|w| (w.addr, w)).collect();
    assert_eq!(words(&packed, by_addr[&flags]), vec![0, 1, 1, 0]);
    let as_words = |seed| mask(seed).iter().map(|&w| w as i32).collect::<Vec<_>>();
    assert_eq!(words(&packed, by_addr[&(rows + row_bytes)]), as_words(1));
    assert_eq!(
        words(&packed, by_addr[&(rows + 2 * row_bytes)]),
        as_words(2)
    );
    // Rows 0 and 3 are not written: their stale words are never read.
    assert!(!by_addr.contains_key(&rows));
    assert!(!by_addr.contains_key(&(rows + 3 * row_bytes)));
    assert_eq!(packed.writes.len(), 4);
}

#[test]
fn a_constrained_chunk_and_resume_mask_row_zero() {
    let core = core();
    let staging = layout(core.clone()).unwrap();
    let flags = addr_of(&core, "staging.sample_masked");
    let rows = addr_of(&core, "staging.sample_mask");
    for (operation, masked) in [
        (
            Operation::PrefillChunk(PrefillChunk {
                slot: Slot(1),
                capacity: 128,
                tokens: vec![4, 5],
                samples: true,
                mask: Some(mask(3)),
            }),
            1,
        ),
        (
            Operation::PrefillChunk(PrefillChunk {
                slot: Slot(1),
                capacity: 128,
                tokens: vec![4, 5],
                samples: false,
                mask: None,
            }),
            0,
        ),
        (
            Operation::Resume(Resume {
                slot: Slot(2),
                mask: Some(mask(4)),
            }),
            1,
        ),
    ] {
        let packed = staging.pack(&launch(operation)).unwrap();
        let by_addr: HashMap<u64, &Write> = packed.writes.iter().map(|w| (w.addr, w)).collect();
        assert_eq!(words(&packed, by_addr[&flags]), vec![masked]);
        assert_eq!(by_addr.contains_key(&rows), masked == 1);
    }
}

#[test]
fn a_mask_of_the_wrong_width_is_refused() {
    let staging = layout(core()).unwrap();
    let decode = launch(Operation::Decode(Decode {
        capacity: 1,
        slots: vec![Slot(1)],
        masks: vec![Some(vec![u32::MAX; MASK_WORDS + 1])],
    }));
    assert_eq!(
        staging.pack(&decode),
        Err(StagingError::TooLong {
            what: "token mask words",
            len: MASK_WORDS + 1,
            capacity: MASK_WORDS as u64,
        })
    );
}

#[test]
fn a_core_without_token_masks_packs_as_before_and_refuses_masks() {
    let mut old = core();
    let contract = old.contract.as_mut().unwrap();
    contract.bindings.retain(|binding| {
        !crate::core::OPTIONAL_SEMANTICS.contains(&Semantic::try_from(binding.semantic).unwrap())
    });
    let staging = layout(old.clone()).unwrap();
    assert!(!staging.takes_masks());
    let mut decode = Decode {
        capacity: 2,
        slots: vec![Slot(1), Slot::NULL],
        masks: Vec::new(),
    };
    let packed = staging
        .pack(&launch(Operation::Decode(decode.clone())))
        .unwrap();
    assert_eq!(packed.writes.len(), 1);
    assert_eq!(packed.writes[0].addr, addr_of(&old, "staging.decode_slots"));
    decode.masks = vec![Some(mask(5)), None];
    assert_eq!(
        staging.pack(&launch(Operation::Decode(decode))),
        Err(StagingError::NoMasks)
    );
}

#[test]
fn an_admit_packs_every_parameter_in_the_semantic_order() {
    let core = core();
    let staging = layout(core.clone()).unwrap();
    let sampling = SamplingParams {
        temperature: 0.5,
        top_k: 7,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.1,
        presence_penalty: 0.2,
        frequency_penalty: 0.3,
    };
    let admit = launch(Operation::Admit(Admit {
        slot: Slot(3),
        prompt: vec![10, 11, 12],
        max_new_tokens: 40,
        sampling,
        seed: u64::MAX - 1,
        consumed: 0,
    }));
    let packed = staging.pack(&admit).unwrap();
    let by_addr: HashMap<u64, &Write> = packed.writes.iter().map(|w| (w.addr, w)).collect();
    let get = |name: &str| words(&packed, by_addr[&addr_of(&core, name)]);
    assert_eq!(get("staging.admit_slot"), vec![3]);
    assert_eq!(get("staging.admit_tokens"), vec![10, 11, 12]);
    assert_eq!(get("staging.admit_len"), vec![3]);
    assert_eq!(get("staging.admit_consumed"), vec![0]);
    assert_eq!(get("staging.admit_int"), vec![7, 40]);
    let floats: Vec<f32> = get("staging.admit_float")
        .into_iter()
        .map(|w| f32::from_le_bytes(w.to_le_bytes()))
        .collect();
    assert_eq!(floats, vec![0.5, 0.9, 0.05, 1.1, 0.2, 0.3]);
    // The seed buffer is I64: the key's bits.
    let seed = by_addr[&addr_of(&core, "staging.admit_seed")];
    let bytes = &packed.bytes[seed.offset..seed.offset + seed.len];
    assert_eq!(u64::from_le_bytes(bytes.try_into().unwrap()), u64::MAX - 1);
    assert_eq!(packed.graph, graph_position(&core, GraphKind::Admit, 1));
    assert_eq!(packed.rows, 0);
}

#[test]
fn a_chunk_and_a_resume_select_their_graphs() {
    let core = core();
    let staging = layout(core.clone()).unwrap();
    let chunk = launch(Operation::PrefillChunk(PrefillChunk {
        slot: Slot(1),
        capacity: 256,
        tokens: vec![4; 130],
        samples: true,
        mask: None,
    }));
    let packed = staging.pack(&chunk).unwrap();
    assert_eq!(packed.graph, graph_position(&core, GraphKind::Prefill, 256));
    assert_eq!(packed.rows, 1);
    let sample = &packed.writes[packed.writes.len() - 2];
    assert_eq!(sample.addr, addr_of(&core, "staging.chunk_sample"));
    assert_eq!(words(&packed, sample), vec![1]);
    let resume = launch(Operation::Resume(Resume {
        slot: Slot(2),
        mask: None,
    }));
    let packed = staging.pack(&resume).unwrap();
    assert_eq!(packed.graph, graph_position(&core, GraphKind::Resume, 1));
    assert_eq!(words(&packed, &packed.writes[0]), vec![2]);
}

#[test]
fn snapshot_and_restore_pack_the_maintenance_inputs_and_read_the_status_back() {
    let core = core();
    let staging = layout(core.clone()).unwrap();
    let snapshot = launch(Operation::Snapshot(Snapshot {
        slot: Slot(3),
        row: SnapshotRow(1),
    }));
    let packed = staging.pack(&snapshot).unwrap();
    assert_eq!(packed.graph, graph_position(&core, GraphKind::Snapshot, 1));
    assert_eq!((packed.rows, packed.status), (0, true));
    let targets: Vec<(u64, Vec<i32>)> = (packed.writes.iter())
        .map(|w| (w.addr, words(&packed, w)))
        .collect();
    assert_eq!(
        targets,
        vec![
            (addr_of(&core, "staging.maint_slot"), vec![3]),
            (addr_of(&core, "staging.maint_row"), vec![1]),
        ]
    );
    let restore = Launch {
        page_updates: vec![PageTableUpdate {
            slot: Slot(2),
            first: 0,
            pages: vec![Page(7), Page(9)],
        }],
        operation: Operation::Restore(Restore {
            slot: Slot(2),
            row: SnapshotRow(1),
            expect: 70,
        }),
    };
    let packed = staging.pack(&restore).unwrap();
    assert_eq!(packed.graph, graph_position(&core, GraphKind::Restore, 1));
    assert_eq!(packed.writes.len(), 4);
    let expect = &packed.writes[3];
    assert_eq!(expect.addr, addr_of(&core, "staging.maint_expect"));
    assert_eq!(words(&packed, expect), vec![70]);
    // The executor copies the status right after the (zero) records.
    assert_eq!(
        staging.completion(&1i32.to_le_bytes(), 0, true).status,
        Some(1)
    );
    assert_eq!(staging.completion(&[], 0, true).status, None);
    let resume = Operation::Resume(Resume {
        slot: Slot(1),
        mask: None,
    });
    assert!(!resume.reports_status());
    assert_eq!(staging.completion(&[0; 24], 1, false).status, None);
}

#[test]
fn launches_that_do_not_fit_are_refused() {
    let staging = layout(core()).unwrap();
    let too_long = launch(Operation::PrefillChunk(PrefillChunk {
        slot: Slot(1),
        capacity: 256,
        tokens: vec![4; 257],
        samples: false,
        mask: None,
    }));
    assert!(matches!(
        staging.pack(&too_long),
        Err(StagingError::TooLong { what: "chunk", .. })
    ));
    let no_graph = launch(Operation::Decode(Decode {
        capacity: 3,
        slots: vec![Slot(1); 3],
        masks: Vec::new(),
    }));
    assert!(matches!(
        staging.pack(&no_graph),
        Err(StagingError::NoGraph { capacity: 3, .. })
    ));
    let past_row = Launch {
        page_updates: vec![PageTableUpdate {
            slot: Slot(1),
            first: 1000,
            pages: vec![Page(1)],
        }],
        operation: Operation::Resume(Resume {
            slot: Slot(1),
            mask: None,
        }),
    };
    assert!(matches!(
        staging.pack(&past_row),
        Err(StagingError::TooLong {
            what: "page-table row",
            ..
        })
    ));
    let token = launch(Operation::PrefillChunk(PrefillChunk {
        slot: Slot(1),
        capacity: 128,
        tokens: vec![u32::MAX],
        samples: false,
        mask: None,
    }));
    assert!(matches!(
        staging.pack(&token),
        Err(StagingError::OutOfRange { what: "chunk", .. })
    ));
}

#[test]
fn records_follow_the_declared_field_order() {
    let mut core = core();
    let order = ["valid", "done", "consumed", "generated", "token", "slot"];
    core.contract.as_mut().unwrap().completion_fields = order.map(str::to_owned).to_vec();
    let staging = layout(core).unwrap();
    let rows: Vec<i32> = vec![1, 0, 9, 2, 77, 3, 1, 2, 4, 5, 88, 1];
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    let completion = staging.records(&bytes, 2);
    assert_eq!(
        completion.records[0],
        CompletionRecord {
            slot: 3,
            token: 77,
            generated: 2,
            consumed: 9,
            done: 0,
            valid: 1,
        }
    );
    assert_eq!(completion.records[1].slot, 1);
    assert_eq!(completion.records[1].done, 2);
    assert_eq!(staging.record_bytes(2), 48);
}

#[test]
fn a_contract_the_records_cannot_be_read_from_is_refused() {
    let mut missing = core();
    missing.contract.as_mut().unwrap().completion_fields.pop();
    assert_eq!(
        layout(missing).unwrap_err(),
        StagingError::MissingField("valid")
    );
    let mut float_slots = core();
    let slots = buffer_mut(&mut float_slots, "staging.decode_slots");
    slots.dtype = DType::DtypeF32 as i32;
    assert!(matches!(
        layout(float_slots),
        Err(StagingError::Binding {
            semantic: Semantic::DecodeSlots,
            ..
        })
    ));
    let mut short_floats = core();
    let floats = buffer_mut(&mut short_floats, "staging.admit_float");
    floats.shape = vec![5];
    floats.strides = vec![1];
    assert!(matches!(
        layout(short_floats),
        Err(StagingError::Binding {
            semantic: Semantic::AdmitFloat,
            ..
        })
    ));
    let mut flat_table = core();
    let table = buffer_mut(&mut flat_table, "state.page_table");
    table.shape = vec![table.shape.iter().product()];
    table.strides = vec![1];
    table.role = BufferRole::RequestState as i32;
    assert!(matches!(
        layout(flat_table),
        Err(StagingError::Binding {
            semantic: Semantic::PageTable,
            ..
        })
    ));
}

#[test]
fn packing_into_a_reused_buffer_equals_a_fresh_pack() {
    let staging = layout(core()).unwrap();
    let admit = Launch {
        page_updates: vec![PageTableUpdate {
            slot: Slot(1),
            first: 0,
            pages: vec![Page(3), Page(4)],
        }],
        operation: Operation::Admit(Admit {
            slot: Slot(1),
            prompt: (0..100).collect(),
            max_new_tokens: 9,
            sampling: SamplingParams::default(),
            seed: 7,
            consumed: 0,
        }),
    };
    let decode = launch(Operation::Decode(Decode {
        capacity: 2,
        slots: vec![Slot(1), Slot::NULL],
        masks: Vec::new(),
    }));
    let mut reused = Packed::default();
    for launch in [&admit, &decode, &admit] {
        staging.pack_into(launch, &mut reused).unwrap();
        assert_eq!(reused, staging.pack(launch).unwrap());
    }
}
