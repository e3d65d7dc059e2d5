//! What `flare replay` prints: load timings, the qualification per step and
//! the decode bench.

use std::fmt;

use helios::replay::{
    DecodeBench, LoadReport, QualificationReport, ReplayReport, Timing, DRIVER_MARGIN,
};

use super::{short, Mib};

/// A replay report as text.
pub struct Text<'a>(pub &'a ReplayReport);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = self.0;
        writeln!(f, "runtime core  {}", report.core)?;
        write_load(f, &report.load)?;
        if let Some(qualification) = &report.qualification {
            write_qualification(f, qualification)?;
        } else if report.load.kv_pages < report.load.kv_pages_prepared {
            writeln!(
                f,
                "qualification not run: its digests cover all {} prepared KV pages",
                report.load.kv_pages_prepared
            )?;
        }
        if let Some(bench) = &report.decode_bench {
            write_bench(f, bench)?;
        }
        for peer in &report.peers {
            writeln!(f, "rank          {}", peer.load.rank)?;
            write_load(f, &peer.load)?;
            if let Some(qualification) = &peer.qualification {
                write_qualification(f, qualification)?;
            }
        }
        Ok(())
    }
}

fn write_load(f: &mut fmt::Formatter<'_>, load: &LoadReport) -> fmt::Result {
    let d = &load.device;
    writeln!(
        f,
        "device        {} {} (compute capability {}.{}, {} SMs, driver {}, {})",
        d.ordinal,
        d.name,
        d.compute_capability_major,
        d.compute_capability_minor,
        d.sm_count,
        d.driver_version,
        Mib(d.total_memory)
    )?;
    writeln!(
        f,
        "window        base {:#x}, {} reserved, {} backed in {} spans",
        load.window_base,
        Mib(load.window_reserved),
        Mib(load.backed_bytes),
        load.spans
    )?;
    write_kv(f, load)?;
    writeln!(
        f,
        "loaded        {} initial tensors ({}), {} kernel images ({}), {} graphs ({} nodes)",
        load.initial_tensors,
        Mib(load.initial_bytes),
        load.images,
        Mib(load.image_bytes),
        load.graphs,
        load.nodes
    )?;
    writeln!(
        f,
        "load time     read {:.1} ms, map {:.1} ms, upload {:.1} ms, modules {:.1} ms, \
         graphs {:.1} ms; total {:.1} ms",
        load.read_ms,
        load.map_ms,
        load.upload_ms,
        load.module_load_ms,
        load.graph_build_ms,
        load.total_ms
    )?;
    writeln!(
        f,
        "free memory   {} after loading",
        Mib(load.free_after_load)
    )
}

fn write_kv(f: &mut fmt::Formatter<'_>, load: &LoadReport) -> fmt::Result {
    let sized = match load.kv_reserve_bytes {
        None => "the prepared extent".to_owned(),
        Some(reserve) => format!(
            "from free memory, {} reserve + {} driver margin kept free",
            Mib(reserve),
            Mib(DRIVER_MARGIN)
        ),
    };
    writeln!(
        f,
        "kv cache      {} of {} prepared pages backed ({}), {} tokens; {sized}",
        load.kv_pages,
        load.kv_pages_prepared,
        Mib(load.kv_bytes),
        load.kv_tokens
    )
}

fn write_free(f: &mut fmt::Formatter<'_>, before: u64, after: u64) -> fmt::Result {
    let verdict = if before == after {
        "replay allocated nothing".to_owned()
    } else {
        format!(
            "CHANGED by {} bytes",
            i128::from(after) - i128::from(before)
        )
    };
    writeln!(
        f,
        "free memory   {} before, {} after: {verdict}",
        Mib(before),
        Mib(after)
    )
}

fn write_qualification(f: &mut fmt::Formatter<'_>, q: &QualificationReport) -> fmt::Result {
    writeln!(f, "qualification {} steps", q.total_steps)?;
    for step in &q.steps {
        let graph = format!("{}@{}", short(step.kind), step.capacity);
        let verdict = if step.ok {
            "ok".to_owned()
        } else {
            format!("MISMATCH {}", step.mismatched.join(", "))
        };
        writeln!(
            f,
            "  step {:>4}  {:<14} {:>3} writes {:>4} digests  {verdict}",
            step.step, graph, step.writes, step.digests
        )?;
    }
    write_free(f, q.free_before, q.free_after)?;
    writeln!(
        f,
        "result        {} of {} steps match{}",
        q.matched_steps,
        q.total_steps,
        if q.passed() { "" } else { ": DIGESTS DIFFER" }
    )
}

fn timing(f: &mut fmt::Formatter<'_>, label: &str, t: &Timing) -> fmt::Result {
    writeln!(
        f,
        "  {label:<12}median {:.4} ms, p99 {:.4} ms (min {:.4}, mean {:.4}, max {:.4})",
        t.median_ms, t.p99_ms, t.min_ms, t.mean_ms, t.max_ms
    )
}

fn write_bench(f: &mut fmt::Formatter<'_>, bench: &DecodeBench) -> fmt::Result {
    writeln!(
        f,
        "decode bench  capacity {} (graph {}), {} steps in {:.1} ms",
        bench.capacity, bench.graph, bench.steps, bench.total_ms
    )?;
    timing(f, "step", &bench.step)?;
    if let Some(gap) = &bench.submission_gap {
        timing(f, "host gap", gap)?;
    }
    writeln!(
        f,
        "  {:<12}{:.4} ms per replay, queued back to back",
        "device", bench.device_ms_per_replay
    )?;
    write_free(f, bench.free_before, bench.free_after)?;
    if let Some(c) = &bench.checkpoint {
        // A copy reads and writes the row: bytes moved over time.
        let rate = |ms: f64| 2.0 * c.row_bytes as f64 / (ms * 1e-3) / 1e9;
        writeln!(
            f,
            "checkpoint    snapshot row {}: snapshot {:.4} ms ({:.0} GB/s), restore {:.4} ms \
             ({:.0} GB/s) per replay, {} queued back to back",
            Mib(c.row_bytes),
            c.snapshot_ms,
            rate(c.snapshot_ms),
            c.restore_ms,
            rate(c.restore_ms),
            c.launches
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use helios::cuda::DeviceInfo;
    use helios::replay::{CheckpointCost, StepReport};

    fn load() -> LoadReport {
        LoadReport {
            rank: 0,
            device: DeviceInfo {
                ordinal: 0,
                name: "NVIDIA H200".to_owned(),
                compute_capability_major: 9,
                compute_capability_minor: 0,
                sm_count: 132,
                driver_version: 13000,
                total_memory: 140 << 30,
            },
            read_ms: 1.0,
            map_ms: 2.0,
            upload_ms: 3.0,
            module_load_ms: 4.0,
            graph_build_ms: 5.0,
            total_ms: 15.0,
            window_base: 0x2000_0000_0000,
            window_reserved: 32 << 20,
            backed_bytes: 16 << 20,
            spans: 2,
            granularity: 2 << 20,
            initial_tensors: 3,
            initial_bytes: 1 << 20,
            images: 1,
            image_bytes: 4096,
            graphs: 9,
            nodes: 10,
            free_after_load: 100 << 30,
            kv_pages: 64,
            kv_pages_prepared: 64,
            kv_bytes: 64 << 20,
            kv_tokens: 63 * 16,
            kv_reserve_bytes: None,
        }
    }

    fn step(ok: bool) -> StepReport {
        StepReport {
            step: 1,
            graph: 0,
            kind: "GRAPH_KIND_DECODE",
            capacity: 4,
            writes: 2,
            digests: 5,
            ok,
            mismatched: if ok {
                Vec::new()
            } else {
                vec!["staging.logits".to_owned(), "state.consumed".to_owned()]
            },
        }
    }

    fn text(qualification: Option<QualificationReport>, bench: Option<DecodeBench>) -> String {
        Text(&ReplayReport {
            core: "tiny.core".to_owned(),
            load: load(),
            qualification,
            decode_bench: bench,
            peers: Vec::new(),
        })
        .to_string()
    }

    #[test]
    fn a_check_lists_every_step_and_the_verdict() {
        let out = text(
            Some(QualificationReport {
                rank: 0,
                steps: vec![step(true), step(false)],
                total_steps: 2,
                matched_steps: 1,
                free_before: 100 << 30,
                free_after: 100 << 30,
                allocation_free: true,
            }),
            None,
        );
        assert!(
            out.contains("device        0 NVIDIA H200 (compute capability 9.0"),
            "{out}"
        );
        assert!(out.contains("base 0x200000000000"), "{out}");
        assert!(out.contains("decode@4"), "{out}");
        assert!(
            out.contains("MISMATCH staging.logits, state.consumed"),
            "{out}"
        );
        assert!(out.contains("replay allocated nothing"), "{out}");
        assert!(out.contains("1 of 2 steps match: DIGESTS DIFFER"), "{out}");
        assert!(
            out.contains("kv cache      64 of 64 prepared pages backed (64.00 MiB), 1008 tokens; the prepared extent"),
            "{out}"
        );
        assert!(!out.contains("qualification not run"), "{out}");
    }

    #[test]
    fn every_peer_rank_reports_its_load_and_its_qualification() {
        let qualification = |rank, ok| QualificationReport {
            rank,
            steps: vec![step(ok)],
            total_steps: 1,
            matched_steps: usize::from(ok),
            free_before: 100 << 30,
            free_after: 100 << 30,
            allocation_free: true,
        };
        let mut peer_load = load();
        peer_load.rank = 1;
        peer_load.window_base = 0x2000_4000_0000;
        let report = ReplayReport {
            core: "tp.core".to_owned(),
            load: load(),
            qualification: Some(qualification(0, true)),
            decode_bench: None,
            peers: vec![helios::replay::PeerReport {
                load: peer_load,
                qualification: Some(qualification(1, false)),
            }],
        };
        // A peer's mismatch fails the whole check.
        assert!(!report.passed());
        let out = Text(&report).to_string();
        let (zero, one) = out
            .split_once("rank          1\n")
            .expect("a section for rank 1");
        assert!(zero.contains("1 of 1 steps match\n"), "{out}");
        assert!(one.contains("base 0x200040000000"), "{out}");
        assert!(one.contains("0 of 1 steps match: DIGESTS DIFFER"), "{out}");
    }

    #[test]
    fn pages_sized_from_free_memory_report_the_reserve_and_the_skipped_check() {
        let mut load = load();
        load.kv_pages = 17;
        load.kv_bytes = 17 << 20;
        load.kv_tokens = 16 * 16;
        load.kv_reserve_bytes = Some(2 << 30);
        let out = Text(&ReplayReport {
            core: "tiny.core".to_owned(),
            load,
            qualification: None,
            decode_bench: None,
            peers: Vec::new(),
        })
        .to_string();
        assert!(
            out.contains(
                "kv cache      17 of 64 prepared pages backed (17.00 MiB), 256 tokens; \
                 from free memory, 2048.00 MiB reserve + 64.00 MiB driver margin kept free"
            ),
            "{out}"
        );
        assert!(
            out.contains("qualification not run: its digests cover all 64 prepared KV pages"),
            "{out}"
        );
    }

    #[test]
    fn a_bench_reports_step_gap_and_device_time() {
        let timing = Timing {
            median_ms: 0.5,
            p99_ms: 0.7,
            mean_ms: 0.55,
            min_ms: 0.4,
            max_ms: 0.9,
        };
        let out = text(
            None,
            Some(DecodeBench {
                capacity: 4,
                graph: 2,
                steps: 256,
                step: timing,
                submission_gap: Some(timing),
                total_ms: 140.0,
                device_ms_per_replay: 0.3,
                free_before: 10,
                free_after: 8,
                allocation_free: false,
                checkpoint: Some(CheckpointCost {
                    row_bytes: 3 << 20,
                    launches: 256,
                    snapshot_ms: 0.002,
                    restore_ms: 0.004,
                }),
            }),
        );
        assert!(out.contains("capacity 4 (graph 2), 256 steps"), "{out}");
        assert!(
            out.contains("step        median 0.5000 ms, p99 0.7000 ms"),
            "{out}"
        );
        assert!(out.contains("host gap    median"), "{out}");
        assert!(out.contains("0.3000 ms per replay"), "{out}");
        assert!(out.contains("CHANGED by -2 bytes"), "{out}");
        // 2 x 3 MiB moved in 2 us and in 4 us.
        assert!(
            out.contains(
                "checkpoint    snapshot row 3.00 MiB: snapshot 0.0020 ms (3146 GB/s), \
                 restore 0.0040 ms (1573 GB/s) per replay, 256 queued back to back"
            ),
            "{out}"
        );
    }
}
