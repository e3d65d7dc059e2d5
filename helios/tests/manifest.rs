//! Decoding and validation of runtime-core manifests.
//!
//! Every test starts from the valid sample core, changes one thing, encodes
//! it and checks the exact error variant `decode_manifest` reports.

use std::path::Path;

use helios::core::proto::{
    node::Op, Binding, Buffer, BufferRole, ContinuationState, Core, Edge, FloatRange, GraphKind,
    KernelNode, Node, Region, RegionKind, Semantic,
};
use helios::core::sample::{
    tiny_core, SAMPLE_DECODE, SAMPLE_IMAGE, SAMPLE_PREFILL, SAMPLE_QUALIFIED,
};
use helios::core::{
    decode_manifest, load_manifest, CoreError, KvAxisProblem, ValidCore, ENGINE_ABI,
};
use prost::Message;

/// One change to the sample core.
type Change = fn(&mut Core);

fn decode(core: &Core) -> Result<ValidCore, CoreError> {
    decode_manifest(&core.encode_to_vec())
}

/// The sample core with one change, decoded.
fn mutated(change: impl FnOnce(&mut Core)) -> Result<ValidCore, CoreError> {
    let mut core = tiny_core();
    change(&mut core);
    decode(&core)
}

fn mutated_err(change: impl FnOnce(&mut Core)) -> CoreError {
    match mutated(change) {
        Ok(_) => panic!("the changed core was accepted"),
        Err(err) => err,
    }
}

fn window(core: &mut Core) -> &mut helios::core::proto::Window {
    core.window.as_mut().unwrap()
}

fn contract(core: &mut Core) -> &mut helios::core::proto::PreparedContract {
    core.contract.as_mut().unwrap()
}

fn frontend(core: &mut Core) -> &mut helios::core::proto::Frontend {
    core.frontend.as_mut().unwrap()
}

fn buffer_index(core: &Core, name: &str) -> usize {
    core.buffers.iter().position(|b| b.name == name).unwrap()
}

// ---------------------------------------------------------------- valid core

#[test]
fn the_sample_core_is_valid() {
    let core = decode(&tiny_core()).unwrap();
    assert_eq!(core.abi_version(), ENGINE_ABI);
    assert_eq!(core.contract().decode_capacities, SAMPLE_DECODE);
    assert_eq!(core.contract().prefill_capacities, SAMPLE_PREFILL);
    assert_eq!(core.images().len(), 1);
    assert_eq!(core.into_core(), tiny_core());
}

#[test]
fn every_semantic_resolves_to_its_buffer() {
    let core = decode(&tiny_core()).unwrap();
    let semantics: Vec<_> = helios::core::required_semantics().collect();
    assert_eq!(semantics.len(), 21);
    for semantic in semantics {
        assert!(core.buffer(semantic).is_some(), "{semantic:?}");
    }
    assert_eq!(
        core.buffer(Semantic::Logits).unwrap().name,
        "staging.logits"
    );
    assert_eq!(
        core.buffer(Semantic::PageTable).unwrap().name,
        "state.page_table"
    );
    assert!(core.buffer(Semantic::Unspecified).is_none());
    assert!(core.buffer_named("kv.pages").is_some());
    assert!(core.buffer_named("nope").is_none());
}

#[test]
fn graphs_are_found_by_kind_and_capacity() {
    let core = decode(&tiny_core()).unwrap();
    for capacity in SAMPLE_DECODE {
        assert!(core.graph(GraphKind::Decode, capacity).is_some());
    }
    for capacity in SAMPLE_PREFILL {
        assert!(core.graph(GraphKind::Prefill, capacity).is_some());
    }
    for kind in [
        GraphKind::Resume,
        GraphKind::Admit,
        GraphKind::Snapshot,
        GraphKind::Restore,
    ] {
        assert!(core.graph(kind, 1).is_some(), "{kind:?}");
    }
    assert!(core.graph(GraphKind::Decode, 3).is_none());
    let decode1 = core.graph(GraphKind::Decode, 1).unwrap();
    assert!(matches!(decode1.nodes[1].op, Some(Op::Kernel(_))));
}

#[test]
fn capacities_are_chosen_smallest_first() {
    let core = decode(&tiny_core()).unwrap();
    let decode: Vec<_> = (0..=5).map(|rows| core.decode_capacity_for(rows)).collect();
    assert_eq!(decode, [Some(1), Some(1), Some(2), Some(4), Some(4), None]);
    assert_eq!(core.prefill_capacity_for(1), Some(128));
    assert_eq!(core.prefill_capacity_for(129), Some(256));
    assert_eq!(core.prefill_capacity_for(257), None);
}

#[test]
fn summary_reports_the_catalog() {
    let summary = decode(&tiny_core()).unwrap().summary();
    assert_eq!(summary.contract.decode_capacities, SAMPLE_DECODE);
    assert_eq!(summary.contract.prefill_capacities, SAMPLE_PREFILL);
    assert_eq!(summary.regions.len(), 7);
    assert_eq!(summary.buffer_count, tiny_core().buffers.len());
    let by_role: usize = summary.buffers_by_role.iter().map(|r| r.count).sum();
    assert_eq!(by_role, summary.buffer_count);
    let decode = &summary.graphs_by_kind[0];
    assert_eq!(decode.kind, GraphKind::Decode);
    assert_eq!(decode.capacities, SAMPLE_DECODE);
    assert_eq!(summary.graphs_by_kind.len(), 6);
    assert_eq!(summary.frontend.eos_token_ids, [2]);
}

// ------------------------------------------------------------ top level

#[test]
fn abi_0_is_missing() {
    let err = mutated_err(|c| c.abi_version = 0);
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "abi_version"
        }
    ));
}

#[test]
fn newer_abi_is_unsupported() {
    let err = mutated_err(|c| c.abi_version = 2);
    assert!(matches!(
        err,
        CoreError::UnsupportedAbi {
            found: 2,
            supported: ENGINE_ABI
        }
    ));
}

#[test]
fn missing_messages_are_named() {
    let cases: [(Change, &str); 4] = [
        (|c| c.identity = None, "identity"),
        (|c| c.window = None, "window"),
        (|c| c.contract = None, "contract"),
        (|c| c.frontend = None, "frontend"),
    ];
    for (change, name) in cases {
        let err = mutated_err(change);
        assert!(
            matches!(err, CoreError::Missing { field } if field == name),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn token_masks_are_optional_but_bound_in_pairs() {
    assert!(decode(&tiny_core()).unwrap().takes_token_masks());
    let is_mask = |b: &Binding| {
        helios::core::OPTIONAL_SEMANTICS.contains(&Semantic::try_from(b.semantic).unwrap())
    };
    // A core exported before token masks loads, and cannot constrain.
    let old = mutated(|c| contract(c).bindings.retain(|b| !is_mask(b))).unwrap();
    assert!(!old.takes_token_masks());
    // One without the other is a broken export.
    let err = mutated_err(|c| {
        (contract(c).bindings).retain(|b| b.semantic != Semantic::SampleMasked as i32)
    });
    assert!(
        matches!(
            err,
            CoreError::Missing {
                field: "SEMANTIC_SAMPLE_MASKED"
            }
        ),
        "{err:?}"
    );
}

#[test]
fn truncated_bytes_fail_to_decode() {
    let bytes = tiny_core().encode_to_vec();
    let err = decode_manifest(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(err, CoreError::Decode(_)));
}

#[test]
fn empty_bytes_are_a_core_with_no_abi() {
    let err = decode_manifest(&[]).unwrap_err();
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "abi_version"
        }
    ));
}

#[test]
fn a_missing_manifest_is_an_io_error_naming_the_file() {
    let err = load_manifest(Path::new("/nonexistent/flare-core")).unwrap_err();
    assert!(matches!(
        err,
        CoreError::Io { ref path, .. } if path == Path::new("/nonexistent/flare-core/manifest.pb")
    ));
}

// --------------------------------------------------------- window, regions

#[test]
fn window_base_0_is_invalid() {
    let err = mutated_err(|c| window(c).base = 0);
    assert!(matches!(err, CoreError::InvalidWindow { .. }));
}

#[test]
fn window_base_must_be_2_mib_aligned() {
    let err = mutated_err(|c| window(c).base += 4096);
    assert!(matches!(err, CoreError::InvalidWindow { .. }));
}

#[test]
fn window_below_32_mib_is_invalid() {
    let err = mutated_err(|c| {
        let w = window(c);
        w.size = 16 << 20;
        w.regions.clear();
    });
    assert!(matches!(err, CoreError::InvalidWindow { .. }));
}

#[test]
fn overlapping_regions_are_rejected() {
    let err = mutated_err(|c| {
        window(c).regions.push(Region {
            kind: RegionKind::Scratch as i32,
            offset: 3 << 20,
            size: 2 << 20,
            backed_bytes: 0,
        })
    });
    assert!(matches!(err, CoreError::InvalidRegion { index: 1 | 7, .. }));
}

#[test]
fn region_past_the_window_is_rejected() {
    let err = mutated_err(|c| {
        let last = window(c).regions.last_mut().unwrap();
        last.size = u64::MAX; // offset + size overflows
    });
    assert!(matches!(err, CoreError::InvalidRegion { index: 6, .. }));
}

#[test]
fn unspecified_region_kind_is_rejected() {
    let err = mutated_err(|c| window(c).regions[2].kind = 0);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "window.regions.kind",
            value: 0
        }
    ));
}

// ---------------------------------------------------------------- buffers

#[test]
fn buffer_outside_the_window_is_rejected() {
    let err = mutated_err(|c| {
        let i = buffer_index(c, "kv.pages");
        c.buffers[i].offset = 32 << 20;
    });
    assert!(matches!(err, CoreError::InvalidView { ref buffer, .. } if buffer == "kv.pages"));
}

#[test]
fn buffer_offset_overflow_is_rejected() {
    let err = mutated_err(|c| c.buffers[0].offset = u64::MAX - 1);
    assert!(matches!(err, CoreError::InvalidView { ref buffer, .. } if buffer == "weight.embed"));
}

#[test]
fn unknown_dtype_is_rejected() {
    let err = mutated_err(|c| c.buffers[0].dtype = 99);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "buffers.dtype",
            value: 99
        }
    ));
}

#[test]
fn unspecified_role_is_rejected() {
    let err = mutated_err(|c| c.buffers[1].role = 0);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "buffers.role",
            value: 0
        }
    ));
}

#[test]
fn duplicate_buffer_names_are_rejected() {
    let err = mutated_err(|c| c.buffers[1].name = c.buffers[0].name.clone());
    assert!(matches!(
        err,
        CoreError::Duplicate { what: "buffer", ref name } if name == "weight.embed"
    ));
}

#[test]
fn empty_buffer_name_is_missing() {
    let err = mutated_err(|c| c.buffers[0].name.clear());
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "buffers.name"
        }
    ));
}

#[test]
fn shape_and_strides_must_match_in_length() {
    let err = mutated_err(|c| {
        c.buffers[0].strides.pop();
    });
    assert!(matches!(err, CoreError::InvalidView { .. }));
}

#[test]
fn strided_extent_must_fit_size_bytes() {
    let err = mutated_err(|c| c.buffers[0].strides[0] += 1);
    assert!(matches!(err, CoreError::InvalidView { .. }));
    let err = mutated_err(|c| c.buffers[0].strides[0] = u64::MAX);
    assert!(matches!(err, CoreError::InvalidView { .. }));
}

#[test]
fn empty_tensors_and_broadcast_strides_are_views() {
    mutated(|c| {
        c.buffers[0].shape[0] = 0;
        c.buffers[1].strides[0] = 0;
    })
    .unwrap();
}

// ----------------------------------------------------------- images, graphs

#[test]
fn image_digest_must_be_lowercase_hex() {
    let err = mutated_err(|c| c.images[0].sha256 = SAMPLE_IMAGE.to_uppercase());
    assert!(matches!(err, CoreError::InvalidImage { .. }));
}

#[test]
fn duplicate_images_are_rejected() {
    let err = mutated_err(|c| c.images.push(c.images[0].clone()));
    assert!(matches!(
        err,
        CoreError::Duplicate {
            what: "kernel image",
            ..
        }
    ));
}

#[test]
fn kernel_node_with_unknown_image_is_rejected() {
    let other = "f".repeat(64);
    let err = mutated_err(|c| {
        c.graphs[3].nodes.push(Node {
            op: Some(Op::Kernel(KernelNode {
                image_sha256: other.clone(),
                ..KernelNode::default()
            })),
        })
    });
    assert!(matches!(
        err,
        CoreError::UnknownReference { what: "kernel image", ref name } if *name == other
    ));
}

#[test]
fn kernel_node_needs_block_dims() {
    let err = mutated_err(|c| match &mut c.graphs[0].nodes[1].op {
        Some(Op::Kernel(kernel)) => kernel.block.as_mut().unwrap().y = 0,
        _ => unreachable!(),
    });
    assert!(matches!(
        err,
        CoreError::InvalidGraph {
            kind: "GRAPH_KIND_DECODE",
            capacity: 1,
            ..
        }
    ));
}

#[test]
fn node_without_op_is_rejected() {
    let err = mutated_err(|c| c.graphs[4].nodes.push(Node { op: None }));
    assert!(matches!(
        err,
        CoreError::InvalidGraph {
            kind: "GRAPH_KIND_PREFILL",
            capacity: 256,
            ..
        }
    ));
}

#[test]
fn edge_to_missing_node_is_rejected() {
    let err = mutated_err(|c| {
        c.graphs[1].edges.push(Edge {
            from: 0,
            to: 1,
            ..Edge::default()
        })
    });
    assert!(matches!(err, CoreError::InvalidGraph { capacity: 2, .. }));
}

#[test]
fn graph_kind_must_be_specified_and_capacity_positive() {
    let err = mutated_err(|c| c.graphs[1].kind = 42);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "graphs.kind",
            value: 42
        }
    ));
    let err = mutated_err(|c| c.graphs[1].capacity = 0);
    assert!(matches!(err, CoreError::InvalidGraph { capacity: 0, .. }));
}

#[test]
fn duplicate_graphs_are_rejected() {
    let err = mutated_err(|c| c.graphs.push(c.graphs[2].clone()));
    assert!(matches!(err, CoreError::Duplicate { what: "graph", .. }));
}

#[test]
fn missing_decode_graph_is_a_catalog_error() {
    let err = mutated_err(|c| c.graphs.retain(|g| g.capacity != 2));
    assert!(matches!(err, CoreError::Catalog { .. }));
}

#[test]
fn missing_single_graphs_are_catalog_errors() {
    for kind in [
        GraphKind::Resume,
        GraphKind::Admit,
        GraphKind::Snapshot,
        GraphKind::Restore,
    ] {
        let err = mutated_err(|c| c.graphs.retain(|g| g.kind != kind as i32));
        assert!(matches!(err, CoreError::Catalog { .. }), "{kind:?}");
    }
}

// --------------------------------------------------------------- contract

#[test]
fn capacity_lists_are_checked() {
    let cases: [Change; 7] = [
        |c| contract(c).decode_capacities.clear(),
        |c| contract(c).decode_capacities = vec![1, 4, 2],
        |c| contract(c).decode_capacities = vec![1, 2, 2, 4],
        |c| contract(c).max_concurrency = 8,
        |c| contract(c).prefill_capacities.clear(),
        |c| contract(c).prefill_capacities = vec![0, 128, 256],
        |c| contract(c).prefill_chunk_size = 512,
    ];
    for (i, change) in cases.into_iter().enumerate() {
        let err = mutated_err(change);
        assert!(
            matches!(err, CoreError::Catalog { .. }),
            "case {i}: {err:?}"
        );
    }
}

#[test]
fn paged_sizes_must_be_multiples_of_page_size() {
    let err = mutated_err(|c| contract(c).context_limit = 500);
    assert!(matches!(
        err,
        CoreError::Contract {
            field: "context_limit",
            ..
        }
    ));
    let err = mutated_err(|c| contract(c).page_size = 96);
    assert!(matches!(
        err,
        CoreError::Contract {
            field: "prefill_chunk_size",
            ..
        }
    ));
    let err = mutated_err(|c| contract(c).page_size = 0);
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "contract.page_size"
        }
    ));
}

#[test]
fn contract_scalars_are_checked() {
    let err = mutated_err(|c| contract(c).kv_pages = 1);
    assert!(matches!(
        err,
        CoreError::Contract {
            field: "kv_pages",
            ..
        }
    ));
    let err = mutated_err(|c| contract(c).vocab_size = 0);
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "contract.vocab_size"
        }
    ));
    let err = mutated_err(|c| contract(c).completion_fields.clear());
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "contract.completion_fields"
        }
    ));
}

#[test]
fn binding_to_unknown_buffer_is_rejected() {
    let err = mutated_err(|c| contract(c).bindings[3].buffer = "staging.nope".to_owned());
    assert!(matches!(
        err,
        CoreError::UnknownReference { what: "buffer", ref name } if name == "staging.nope"
    ));
}

#[test]
fn duplicate_binding_is_rejected() {
    let err = mutated_err(|c| {
        contract(c).bindings.push(Binding {
            semantic: Semantic::Logits as i32,
            buffer: "weight.embed".to_owned(),
        })
    });
    assert!(matches!(
        err,
        CoreError::Duplicate { what: "binding", ref name } if name == "SEMANTIC_LOGITS"
    ));
}

#[test]
fn missing_semantic_is_named() {
    let err = mutated_err(|c| {
        contract(c)
            .bindings
            .retain(|b| b.semantic != Semantic::StopTokens as i32)
    });
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "SEMANTIC_STOP_TOKENS"
        }
    ));
}

#[test]
fn unspecified_binding_semantic_is_rejected() {
    let err = mutated_err(|c| contract(c).bindings[0].semantic = 0);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "contract.bindings.semantic",
            value: 0
        }
    ));
}

// --------------------------------------------------------------- frontend

#[test]
fn frontend_facts_are_required() {
    let cases: [Change; 7] = [
        |c| frontend(c).tokenizer_json.clear(),
        |c| frontend(c).eos_token_ids.clear(),
        |c| frontend(c).sampling.as_mut().unwrap().temperature = 0.0,
        |c| frontend(c).sampling.as_mut().unwrap().temperature = f32::NAN,
        |c| frontend(c).sampling.as_mut().unwrap().top_p = f32::INFINITY,
        // Requests clamp into ranges (f32::clamp panics on these).
        |c| {
            let sampling = frontend(c).sampling.as_mut().unwrap();
            sampling.top_p_range = Some(FloatRange { min: 1.0, max: 0.5 });
        },
        |c| {
            let sampling = frontend(c).sampling.as_mut().unwrap();
            sampling.min_p_range = Some(FloatRange {
                min: f32::NAN,
                max: 1.0,
            });
        },
    ];
    for (i, change) in cases.into_iter().enumerate() {
        let err = mutated_err(change);
        assert!(
            matches!(err, CoreError::Frontend { .. }),
            "case {i}: {err:?}"
        );
    }
    let err = mutated_err(|c| frontend(c).sampling = None);
    assert!(matches!(
        err,
        CoreError::Missing {
            field: "frontend.sampling"
        }
    ));
}

#[test]
fn parsers_must_be_specified() {
    let err = mutated_err(|c| frontend(c).tool_parser = 0);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "frontend.tool_parser",
            value: 0
        }
    ));
    let err = mutated_err(|c| frontend(c).reasoning_parser = 7);
    assert!(matches!(
        err,
        CoreError::UnknownEnum {
            field: "frontend.reasoning_parser",
            value: 7
        }
    ));
}

#[test]
fn a_parser_without_its_markers_is_rejected() {
    use helios::core::proto::{Marker, ReasoningParser, ToolMarkers, ToolParser};
    let err = mutated_err(|c| frontend(c).tool_parser = ToolParser::JsonInTags as i32);
    assert!(matches!(err, CoreError::Frontend { reason } if reason.contains("call_start")));
    let err = mutated_err(|c| {
        let frontend = frontend(c);
        frontend.tool_parser = ToolParser::JsonInTags as i32;
        frontend.tool_markers = Some(ToolMarkers {
            call_start: Some(Marker {
                text: "<tool_call>".to_owned(),
                token_id: None,
            }),
            ..ToolMarkers::default()
        });
    });
    assert!(matches!(err, CoreError::Frontend { reason } if reason.contains("call_end")));
    let err = mutated_err(|c| frontend(c).tool_parser = ToolParser::JsonAnswer as i32);
    assert!(matches!(err, CoreError::Frontend { reason } if reason.contains("separator")));
    let err = mutated_err(|c| frontend(c).reasoning_parser = ReasoningParser::ThinkTags as i32);
    assert!(matches!(err, CoreError::Frontend { reason } if reason.contains("reasoning_markers")));
}

#[test]
fn region_backing_more_than_it_holds_is_rejected() {
    let err = mutated_err(|c| {
        let region = &mut window(c).regions[2];
        region.backed_bytes = region.size + 1;
    });
    assert!(matches!(err, CoreError::InvalidRegion { index: 2, .. }));
}

fn qualification(core: &mut Core) -> &mut helios::core::proto::Qualification {
    core.qualification
        .as_mut()
        .expect("the sample core carries a qualification")
}

#[test]
fn the_sample_qualification_is_exposed() {
    let core = decode(&tiny_core()).expect("valid");
    let steps = &core.qualification().expect("present").steps;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].writes[0].buffer, SAMPLE_QUALIFIED);
    assert!(mutated(|c| c.qualification = None)
        .expect("qualification is optional")
        .qualification()
        .is_none());
}

#[test]
fn qualification_steps_are_checked() {
    let graphs = tiny_core().graphs.len() as u32;
    let err = mutated_err(|c| qualification(c).steps[0].graph = graphs);
    assert!(matches!(
        err,
        CoreError::InvalidQualification { step: 0, .. }
    ));
    let err = mutated_err(|c| qualification(c).steps[0].writes[0].offset = u64::MAX - 1);
    assert!(matches!(
        err,
        CoreError::InvalidQualification { step: 0, .. }
    ));
    let err = mutated_err(|c| qualification(c).steps[0].writes[0].data.clear());
    assert!(matches!(
        err,
        CoreError::InvalidQualification { step: 0, .. }
    ));
    let err = mutated_err(|c| qualification(c).steps[0].digests[0].sha256 = "AB".into());
    assert!(matches!(
        err,
        CoreError::InvalidQualification { step: 0, .. }
    ));
    let err = mutated_err(|c| qualification(c).steps[0].writes[0].buffer = "nope".into());
    assert!(matches!(
        err,
        CoreError::UnknownReference { what: "buffer", .. }
    ));
    let err = mutated_err(|c| qualification(c).steps[0].digests[0].buffer = "nope".into());
    assert!(matches!(
        err,
        CoreError::UnknownReference { what: "buffer", .. }
    ));
}

// ------------------------------------------------------------ KV page axis

fn kv_buffer(core: &mut Core) -> &mut Buffer {
    let index = buffer_index(core, "kv.pages");
    &mut core.buffers[index]
}

fn kv_problem(change: impl FnOnce(&mut Core)) -> KvAxisProblem {
    match mutated_err(change) {
        CoreError::KvPageAxis { problem, .. } => problem,
        other => panic!("expected a kv_page_axis error, got {other:?}"),
    }
}

#[test]
fn the_page_axis_gives_the_kv_layout() {
    // The sample's KV pages buffer is [pages 8, 2, 16, 64] bf16 at 8 MiB.
    let core = decode(&tiny_core()).unwrap();
    let layout = core.kv_layout().expect("the sample names its page axis");
    assert_eq!(layout.slabs, [8 << 20]);
    assert_eq!(layout.page_stride, core.contract().bytes_per_page);
    let older = mutated(|c| contract(c).kv_page_axis = None).expect("the axis is optional");
    assert!(older.kv_layout().is_none());
}

#[test]
fn ignitions_kv_layout_is_validated_slab_by_slab() {
    // [layers 2, 2, pages 8, page_size 16, heads 1, dim 32]: 4 slabs.
    let core = mutated(|c| {
        let kv = kv_buffer(c);
        kv.shape = vec![2, 2, 8, 16, 1, 32];
        kv.strides = vec![8192, 4096, 512, 32, 32, 1];
        contract(c).kv_page_axis = Some(2);
        contract(c).bytes_per_page = 4 * 512 * 2;
    })
    .unwrap();
    let layout = core.kv_layout().unwrap();
    let base = 8u64 << 20;
    assert_eq!(
        layout.slabs,
        [base, base + 8192, base + 16384, base + 24576]
    );
    assert_eq!(layout.page_stride, 1024);
}

#[test]
fn a_page_axis_that_does_not_fit_the_buffer_is_rejected() {
    assert_eq!(
        kv_problem(|c| contract(c).kv_page_axis = Some(4)),
        KvAxisProblem::PastRank { rank: 4 }
    );
    assert_eq!(
        kv_problem(|c| contract(c).kv_page_axis = Some(1)),
        KvAxisProblem::PageCount {
            found: 2,
            kv_pages: 8
        }
    );
    assert!(matches!(
        kv_problem(|c| contract(c).bytes_per_page *= 2),
        KvAxisProblem::BytesPerPage {
            slabs: 1,
            computed: 4096,
            ..
        }
    ));
    assert!(matches!(
        kv_problem(|c| kv_buffer(c).strides[0] = 1024),
        KvAxisProblem::PageOverlap {
            span: 2048,
            stride: 1024
        }
    ));
    assert_eq!(
        kv_problem(|c| kv_buffer(c).offset = 0),
        KvAxisProblem::OutsideRegion
    );
}

#[test]
fn the_page_axis_needs_exactly_one_kv_pages_buffer() {
    let err = mutated_err(|c| kv_buffer(c).role = BufferRole::Weight as i32);
    assert!(matches!(err, CoreError::Missing { .. }), "{err:?}");
    assert!(mutated(|c| {
        kv_buffer(c).role = BufferRole::Weight as i32;
        contract(c).kv_page_axis = None;
    })
    .is_ok());
    let err = mutated_err(|c| {
        let index = buffer_index(c, "snapshot.kv");
        c.buffers[index].role = BufferRole::KvPages as i32;
    });
    assert!(
        matches!(err, CoreError::Duplicate { ref name, .. } if name == "snapshot.kv"),
        "{err:?}"
    );
}

#[test]
fn random_kv_geometries_are_rejected_or_consistent() {
    let mut rng = XorShift(0x5eed_5eed_4b1e_a7e5);
    let (mut accepted, mut rejected) = (0u32, 0u32);
    for _ in 0..3000 {
        let mut core = tiny_core();
        let rank = 1 + rng.below(6);
        let shape: Vec<u64> = (0..rank).map(|_| rng.below(5) as u64).collect();
        let strides: Vec<u64> = (0..rank).map(|_| rng.below(300) as u64).collect();
        let axis = rng.below(rank + 1);
        let kv_pages = 2 + rng.below(3) as u32;
        let mut shape = shape;
        // Half the time the axis counts the pages and bytes_per_page is the
        // slabs' page strides in bytes, so that some geometries pass.
        let consistent = rng.below(2) == 0 && axis < rank;
        if consistent {
            shape[axis] = u64::from(kv_pages);
        }
        let bytes_per_page = if consistent {
            shape[..axis].iter().product::<u64>() * strides[axis] * 2
        } else {
            rng.below(4096) as u64
        };
        let kv = kv_buffer(&mut core);
        kv.shape = shape;
        kv.strides = strides;
        kv.size_bytes = 1 + rng.below(1 << 16) as u64;
        let c = contract(&mut core);
        c.kv_page_axis = Some(axis as u32);
        c.kv_pages = kv_pages;
        c.bytes_per_page = bytes_per_page;
        let Ok(valid) = decode(&core) else {
            rejected += 1;
            continue;
        };
        accepted += 1;
        // Accepted: one page of every slab is bytes_per_page together, and
        // every prepared page lies inside the buffer.
        let layout = valid.kv_layout().unwrap();
        let contract = valid.contract();
        let kv = valid.buffer_named("kv.pages").unwrap();
        assert_eq!(
            layout.slabs.len() as u64 * layout.page_stride,
            contract.bytes_per_page
        );
        for (start, end) in layout.page_ranges(contract.kv_pages) {
            assert!(kv.offset <= start && start < end);
            let last_page_end = end - layout.page_stride;
            assert!(last_page_end < kv.offset + kv.size_bytes);
        }
    }
    assert!(accepted > 0 && rejected > 0, "{accepted} / {rejected}");
}

// ------------------------------------------------------------------- fuzz

/// xorshift64: a tiny deterministic generator, enough to spread mutations.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value in `0..bound` (`bound` > 0).
    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

fn mutate(rng: &mut XorShift, bytes: &mut Vec<u8>) {
    let len = bytes.len();
    match rng.below(6) {
        0 if len > 0 => {
            let i = rng.below(len);
            bytes[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            bytes[i] = rng.next() as u8;
        }
        2 => bytes.truncate(rng.below(len + 1)),
        3 => {
            let i = rng.below(len + 1);
            let n = 1 + rng.below(8);
            let insert: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            bytes.splice(i..i, insert);
        }
        4 if len > 0 => {
            let i = rng.below(len);
            let end = (i + 1 + rng.below(16)).min(len);
            bytes.drain(i..end);
        }
        _ if len > 0 => {
            // Varint-heavy values: a large length or tag where one was.
            let i = rng.below(len);
            bytes[i] = 0xff;
        }
        _ => bytes.push(rng.next() as u8),
    }
}

#[test]
fn decoding_mutated_bytes_never_panics() {
    let valid = tiny_core().encode_to_vec();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut rejected) = (0u32, 0u32);
    for _ in 0..4000 {
        let mut bytes = valid.clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut bytes);
        }
        match decode_manifest(&bytes) {
            Ok(_) => accepted += 1,
            Err(_) => rejected += 1,
        }
    }
    assert_eq!(accepted + rejected, 4000);
    assert!(rejected > 0, "no mutation was rejected");
}

#[test]
fn decoding_random_bytes_never_panics() {
    let mut rng = XorShift(0x0123_4567_89ab_cdef);
    for _ in 0..2000 {
        let len = rng.below(512);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = decode_manifest(&bytes);
    }
}

// ---------------------------------------------------------------- fixture

#[test]
fn the_python_fixture_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let manifest = dir.join("manifest.pb");
    assert!(
        manifest.is_file(),
        "fixture {} is missing: write it with \
         `python -m ignition.export.manifest --fixture helios/tests/fixtures/tiny-core`",
        manifest.display()
    );
    let core = load_manifest(&dir).unwrap_or_else(|err| panic!("fixture rejected: {err}"));
    let summary = core.summary();
    assert_eq!(summary.contract.decode_capacities, [1, 2, 4]);
    assert_eq!(summary.contract.prefill_capacities, [128, 256]);
}

#[test]
fn kernel_parameters_must_fit_their_bytes() {
    let err = mutated_err(|c| match &mut c.graphs[0].nodes[1].op {
        Some(Op::Kernel(kernel)) => kernel.param_offsets[0] = 4,
        _ => unreachable!(),
    });
    assert!(
        matches!(&err, CoreError::InvalidGraph { capacity: 1, reason, .. } if reason.contains("kernel parameters")),
        "{err}"
    );
}

#[test]
fn a_partly_zero_cluster_is_rejected() {
    let err = mutated_err(|c| match &mut c.graphs[0].nodes[1].op {
        Some(Op::Kernel(kernel)) => {
            kernel.cluster = Some(helios::core::proto::Dim3 { x: 1, y: 0, z: 0 })
        }
        _ => unreachable!(),
    });
    assert!(
        matches!(&err, CoreError::InvalidGraph { reason, .. } if reason.contains("zero axis")),
        "{err}"
    );
}

#[test]
fn memset_and_memcpy_nodes_must_stay_in_the_window() {
    use helios::core::proto::{MemcpyNode, MemsetNode};
    let base = helios::core::sample::SAMPLE_BASE;
    let size = helios::core::sample::SAMPLE_WINDOW;
    let memset = |dst, width| Node {
        op: Some(Op::Memset(MemsetNode {
            dst,
            pitch: 0,
            value: 0,
            element_size: 4,
            width,
            height: 1,
        })),
    };
    assert!(mutated(|c| c.graphs[2].nodes.push(memset(base, 16))).is_ok());
    let err = mutated_err(|c| c.graphs[2].nodes.push(memset(base + size - 8, 16)));
    assert!(
        matches!(&err, CoreError::InvalidGraph { reason, .. } if reason.contains("outside the window")),
        "{err}"
    );
    let err = mutated_err(|c| {
        let mut odd = memset(base, 16);
        if let Some(Op::Memset(m)) = &mut odd.op {
            m.element_size = 3;
        }
        c.graphs[2].nodes.push(odd)
    });
    assert!(
        matches!(&err, CoreError::InvalidGraph { reason, .. } if reason.contains("element size")),
        "{err}"
    );
    let copy = |src, dst, size_bytes| Node {
        op: Some(Op::Memcpy(MemcpyNode {
            src,
            dst,
            size_bytes,
        })),
    };
    assert!(mutated(|c| c.graphs[2].nodes.push(copy(base, base + 4096, 64))).is_ok());
    let err = mutated_err(|c| c.graphs[2].nodes.push(copy(base - 4096, base, 64)));
    assert!(
        matches!(&err, CoreError::InvalidGraph { reason, .. } if reason.contains("source")),
        "{err}"
    );
    let err = mutated_err(|c| c.graphs[2].nodes.push(copy(base, base, 0)));
    assert!(
        matches!(&err, CoreError::InvalidGraph { reason, .. } if reason.contains("0 bytes")),
        "{err}"
    );
}

// ---------------------------------------------------------------- rank layout

fn ranked(world_size: u32, change: impl FnOnce(&mut Core)) -> Result<ValidCore, CoreError> {
    let mut core = helios::core::sample::ranked_core(world_size);
    change(&mut core);
    decode(&core)
}

fn rank_layout_reason(result: Result<ValidCore, CoreError>) -> String {
    match result {
        Err(CoreError::RankLayout { reason }) => reason,
        Err(other) => panic!("rejected for another reason: {other}"),
        Ok(_) => panic!("the changed core was accepted"),
    }
}

#[test]
fn a_two_rank_core_loads_with_its_peer_in_rank_order() {
    let core = ranked(2, |_| {}).unwrap();
    assert_eq!(core.world_size(), 2);
    let peer = &core.peers()[0];
    assert_eq!(peer.rank(), 1);
    assert_eq!(peer.window().base, core.window().base + core.window().size);
    // The peer's bound buffers and catalog mirror rank 0's.
    assert_eq!(
        peer.buffer(Semantic::DecodeSlots).map(|b| &b.name),
        core.buffer(Semantic::DecodeSlots).map(|b| &b.name)
    );
    assert!(peer.graph(GraphKind::Decode, 4).is_some());
    // A one-rank core has no peers, and the layout round-trips.
    assert_eq!(decode(&tiny_core()).unwrap().world_size(), 1);
    let four = ranked(4, |_| {}).unwrap();
    let again = decode(&four.clone().into_core()).unwrap();
    assert_eq!(again.world_size(), 4);
    let ranks: Vec<u32> = again.peers().iter().map(|p| p.rank()).collect();
    assert_eq!(ranks, [1, 2, 3]);
}

/// A `world_size`-rank core whose windows are 64 MiB, rank `r`'s holding a
/// 2 MiB collectives region at `offsets[r]` MiB (none where `None`).
fn with_collectives(world_size: u32, offsets: &[Option<u64>]) -> Result<ValidCore, CoreError> {
    const MIB: u64 = 1 << 20;
    let region = |offset: u64| Region {
        kind: RegionKind::Collectives as i32,
        offset: offset * MIB,
        size: 2 * MIB,
        backed_bytes: 2 * MIB,
    };
    let mut core = tiny_core();
    let window = core.window.as_mut().unwrap();
    window.size = 64 * MIB;
    window.regions.extend(offsets[0].map(region));
    if world_size == 1 {
        return decode(&core);
    }
    let mut core = helios::core::sample::with_ranks(core, world_size);
    let layout = core.rank_layout.as_mut().unwrap();
    for (peer, offset) in layout.peers.iter_mut().zip(&offsets[1..]) {
        let window = peer.window.as_mut().unwrap();
        window
            .regions
            .retain(|r| r.kind != RegionKind::Collectives as i32);
        window.regions.extend(offset.map(region));
    }
    decode(&core)
}

#[test]
fn every_rank_holds_its_collectives_region_where_rank_zero_does() {
    // The same offset and size on every rank: a rank reaches its peer's region
    // at the peer's base plus that offset.
    let core = with_collectives(2, &[Some(40), Some(40)]).unwrap();
    assert_eq!(core.world_size(), 2);
    assert!(with_collectives(2, &[None, None]).is_ok());
    let reason = rank_layout_reason(with_collectives(2, &[Some(40), Some(42)]));
    assert!(reason.contains("rank 1's collectives region"), "{reason}");
    let reason = rank_layout_reason(with_collectives(3, &[Some(40), Some(40), None]));
    assert!(
        reason.contains("rank 2's collectives region (none)"),
        "{reason}"
    );
    let reason = rank_layout_reason(with_collectives(2, &[None, Some(40)]));
    assert!(reason.contains("is not rank 0's (none)"), "{reason}");
    // Two in one window.
    let mut core = tiny_core();
    let window = core.window.as_mut().unwrap();
    window.size = 64 << 20;
    for offset in [40u64, 44] {
        window.regions.push(Region {
            kind: RegionKind::Collectives as i32,
            offset: offset << 20,
            size: 2 << 20,
            backed_bytes: 0,
        });
    }
    let two = helios::core::sample::with_ranks(core, 2);
    let reason = rank_layout_reason(decode(&two));
    assert!(reason.contains("two collectives regions"), "{reason}");
    // A core of one rank has no peer to exchange with.
    let reason = rank_layout_reason(with_collectives(1, &[Some(40)]));
    assert!(
        reason.contains("collectives region, but the core has no rank layout"),
        "{reason}"
    );
    assert!(with_collectives(1, &[None]).is_ok());
}

#[test]
fn the_collectives_wait_limit_is_an_aligned_word_inside_the_region() {
    const MIB: u64 = 1 << 20;
    // Every rank's 2 MiB collectives region at 40 MiB of a 64 MiB window, the
    // layout naming the wait limit's offset.
    let layout = |offset: Option<u64>, regions: bool| {
        let mut core = tiny_core();
        let window = core.window.as_mut().unwrap();
        window.size = 64 * MIB;
        if regions {
            window.regions.push(Region {
                kind: RegionKind::Collectives as i32,
                offset: 40 * MIB,
                size: 2 * MIB,
                backed_bytes: 2 * MIB,
            });
        }
        let mut core = helios::core::sample::with_ranks(core, 2);
        core.rank_layout
            .as_mut()
            .unwrap()
            .collectives_wait_limit_offset = offset;
        decode(&core)
    };
    let core = layout(Some(528), true).unwrap();
    assert_eq!(core.collectives_wait_limit_offset(), Some(528));
    let again = decode(&core.into_core()).unwrap();
    assert_eq!(again.collectives_wait_limit_offset(), Some(528));
    assert_eq!(
        layout(None, true).unwrap().collectives_wait_limit_offset(),
        None
    );
    for offset in [3, 2 * MIB - 4, 2 * MIB, u64::MAX - 3] {
        let reason = rank_layout_reason(layout(Some(offset), true));
        assert!(
            reason.contains("not an aligned 8-byte word"),
            "{offset}: {reason}"
        );
    }
    let reason = rank_layout_reason(layout(Some(528), false));
    assert!(
        reason.contains("no window holds a collectives region"),
        "{reason}"
    );
}

#[test]
fn missing_and_repeated_ranks_are_rejected() {
    let layout = |c: &mut Core| c.rank_layout.as_mut().unwrap().peers.clone();
    let missing = rank_layout_reason(ranked(3, |c| {
        c.rank_layout.as_mut().unwrap().peers.remove(0);
    }));
    assert!(missing.contains("rank 1 of 3 is missing"), "{missing}");
    let twice = rank_layout_reason(ranked(3, |c| {
        let mut peers = layout(c);
        peers[1].rank = 1;
        c.rank_layout.as_mut().unwrap().peers = peers;
    }));
    assert!(twice.contains("rank 1 appears twice"), "{twice}");
    let outside = rank_layout_reason(ranked(2, |c| {
        c.rank_layout.as_mut().unwrap().peers[0].rank = 2;
    }));
    assert!(outside.contains("rank 2 is outside 1..2"), "{outside}");
    let zero = rank_layout_reason(ranked(2, |c| {
        c.rank_layout.as_mut().unwrap().peers[0].rank = 0;
    }));
    assert!(zero.contains("rank 0 is outside"), "{zero}");
    let alone = rank_layout_reason(ranked(2, |c| {
        let layout = c.rank_layout.as_mut().unwrap();
        layout.world_size = 1;
        layout.peers.clear();
    }));
    assert!(alone.contains("world_size 1"), "{alone}");
}

#[test]
fn mismatched_capacities_are_rejected() {
    fn peer_graphs(c: &mut Core) -> &mut Vec<helios::core::proto::Graph> {
        &mut c.rank_layout.as_mut().unwrap().peers[0].graphs
    }
    let lacks = rank_layout_reason(ranked(2, |c| {
        let graphs = peer_graphs(c);
        let at = graphs
            .iter()
            .position(|g| g.kind == GraphKind::Decode as i32 && g.capacity == 4)
            .unwrap();
        graphs.remove(at);
    }));
    assert!(
        lacks.contains("rank 1 lacks rank 0's graph GRAPH_KIND_DECODE@4"),
        "{lacks}"
    );
    let extra = rank_layout_reason(ranked(2, |c| {
        let graphs = peer_graphs(c);
        let mut more = graphs[0].clone();
        more.capacity = 8;
        graphs.push(more);
    }));
    assert!(
        extra.contains("has graph GRAPH_KIND_DECODE@8, which rank 0 lacks"),
        "{extra}"
    );
    // The staging every rank binds must be rank 0's layout: one packing for all.
    let staging = rank_layout_reason(ranked(2, |c| {
        let peer = &mut c.rank_layout.as_mut().unwrap().peers[0];
        let slots = (peer.buffers.iter_mut())
            .find(|b| b.name == "staging.decode_slots")
            .unwrap();
        slots.shape[0] /= 2;
        slots.size_bytes /= 2;
    }));
    assert!(
        staging.contains("rank 1 binds SEMANTIC_DECODE_SLOTS"),
        "{staging}"
    );
}

#[test]
fn overlapping_windows_and_invalid_peer_bundles_are_rejected() {
    let overlap = rank_layout_reason(ranked(3, |c| {
        let peers = &mut c.rank_layout.as_mut().unwrap().peers;
        let base = peers[0].window.as_ref().unwrap().base;
        peers[1].window.as_mut().unwrap().base = base + 2 * (1 << 20);
    }));
    assert!(
        overlap.contains("the windows of rank 1 and rank 2 overlap"),
        "{overlap}"
    );
    let on_zero = rank_layout_reason(ranked(2, |c| {
        let base = c.window.as_ref().unwrap().base;
        c.rank_layout.as_mut().unwrap().peers[0]
            .window
            .as_mut()
            .unwrap()
            .base = base;
    }));
    assert!(on_zero.contains("rank 0 and rank 1 overlap"), "{on_zero}");
    // A peer's own bundle is checked as a one-rank core's, and the error names it.
    let err = ranked(2, |c| {
        let peer = &mut c.rank_layout.as_mut().unwrap().peers[0];
        peer.buffers.retain(|b| b.name != "staging.logits");
    })
    .unwrap_err();
    assert!(
        matches!(&err, CoreError::InRank { rank: 1, source } if matches!(**source, CoreError::UnknownReference { .. })),
        "{err}"
    );
    let err = ranked(2, |c| {
        c.rank_layout.as_mut().unwrap().peers[0].window = None
    })
    .unwrap_err();
    assert!(
        matches!(&err, CoreError::InRank { rank: 1, source } if matches!(**source, CoreError::Missing { field: "window" })),
        "{err}"
    );
}

#[test]
fn every_rank_carries_a_qualification_that_replays_in_lockstep_with_rank_zeros() {
    // Each rank's own sequence travels with its bundle and round-trips.
    let core = ranked(2, |_| {}).unwrap();
    let peer = &core.peers()[0];
    assert_eq!(peer.qualification(), core.qualification());
    let again = decode(&core.clone().into_core()).unwrap();
    assert!(again.peers()[0].qualification().is_some());
    assert!(ranked(2, |c| {
        c.qualification = None;
        c.rank_layout.as_mut().unwrap().peers[0].qualification = None;
    })
    .is_ok());
    // One without the other.
    let peer_lacks = rank_layout_reason(ranked(2, |c| {
        c.rank_layout.as_mut().unwrap().peers[0].qualification = None;
    }));
    assert!(
        peer_lacks.contains("rank 0 carries a qualification sequence and rank 1 none"),
        "{peer_lacks}"
    );
    let zero_lacks = rank_layout_reason(ranked(3, |c| c.qualification = None));
    assert!(
        zero_lacks.contains("rank 1 carries a qualification sequence and rank 0 none"),
        "{zero_lacks}"
    );
    // Not as long.
    let longer = rank_layout_reason(ranked(2, |c| {
        let steps = &mut c.rank_layout.as_mut().unwrap().peers[0]
            .qualification
            .as_mut()
            .unwrap()
            .steps;
        steps.push(steps[0].clone());
    }));
    assert!(
        longer.contains("rank 1's qualification has 2 steps, rank 0's 1"),
        "{longer}"
    );
    // Another graph at a step: its collectives would wait for rank 0's forever.
    let other = rank_layout_reason(ranked(2, |c| {
        let peer = &mut c.rank_layout.as_mut().unwrap().peers[0];
        let prefill = (peer.graphs.iter())
            .position(|g| g.kind == GraphKind::Prefill as i32)
            .unwrap();
        peer.qualification.as_mut().unwrap().steps[0].graph = prefill as u32;
    }));
    assert!(
        other.contains("qualification step 0 launches GRAPH_KIND_PREFILL@")
            && other.contains("on rank 1 but GRAPH_KIND_DECODE@"),
        "{other}"
    );
    // The peer's own steps are checked against its own buffers, naming it.
    let err = ranked(2, |c| {
        let steps = &mut c.rank_layout.as_mut().unwrap().peers[0]
            .qualification
            .as_mut()
            .unwrap()
            .steps;
        steps[0].writes[0].buffer = "nope".into();
    })
    .unwrap_err();
    assert!(
        matches!(&err, CoreError::InRank { rank: 1, source } if matches!(**source, CoreError::UnknownReference { .. })),
        "{err}"
    );
}

#[test]
fn the_continuation_state_is_read_as_declared_and_unspecified_as_rows() {
    let declared = |value: ContinuationState| {
        mutated(|core| contract(core).continuation = value as i32)
            .unwrap()
            .continuation()
    };
    assert_eq!(
        declared(ContinuationState::PositionalKv),
        ContinuationState::PositionalKv
    );
    assert_eq!(
        declared(ContinuationState::ContinuationRows),
        ContinuationState::ContinuationRows
    );
    // An older core declares nothing: only its live end is known to be exact.
    assert_eq!(
        declared(ContinuationState::Unspecified),
        ContinuationState::ContinuationRows
    );
    assert!(matches!(
        mutated_err(|core| contract(core).continuation = 7),
        CoreError::UnknownEnum {
            field: "contract.continuation",
            value: 7
        }
    ));
}
