//! The one driver of a core's replay check: `flare replay --check` /
//! `--bench-decode` and Heliopause's in-process `replay_check` both call
//! [`check_core`] (and [`isolate_core`] for `--isolate` / `isolate=True`).
//!
//! Rules enforced here:
//! - the core is loaded per [`CheckOptions::load`], and a bench's decode
//!   capacity is checked against the core's graphs before any replay
//!   ([`ReplayError::NoDecodeGraph`]);
//! - the qualification runs when asked for, and otherwise before a bench
//!   when the core has one and every prepared KV page is backed (its digests
//!   cover them all) — [`CheckOptions::runs_qualification`];
//! - the bench runs after the qualification, so the decode slots hold the
//!   requests it admitted;
//! - isolation always backs every prepared KV page (the sequence covers
//!   them).

use std::num::NonZeroU32;
use std::path::Path;

use super::bench::DecodeBench;
use super::error::ReplayError;
use super::isolate::IsolationReport;
use super::kv_backing::KvBacking;
use super::loaded::{LoadOptions, LoadedCore};
use super::report::{PeerReport, ReplayReport};
use crate::core::proto::GraphKind;

/// What [`check_core`] runs once the core is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    /// How to load the core (device, KV backing).
    pub load: LoadOptions,
    /// Replay the qualification sequence whatever else runs.
    pub qualification: bool,
    /// Time this many replays of the decode graph of this capacity.
    pub bench_decode: Option<(u32, NonZeroU32)>,
}

impl CheckOptions {
    /// The qualification check alone, every prepared KV page backed, on
    /// device `device`: `flare replay --check` and `replay_check(core)`.
    pub fn qualification(device: i32) -> Self {
        Self {
            load: LoadOptions {
                device,
                kv: KvBacking::Prepared,
                ..LoadOptions::default()
            },
            qualification: true,
            bench_decode: None,
        }
    }

    /// Whether the qualification runs for a core that has one
    /// (`has_qualification`) loaded with `every_page` of its prepared KV
    /// pages backed or not.
    pub fn runs_qualification(&self, has_qualification: bool, every_page: bool) -> bool {
        self.qualification || (has_qualification && every_page)
    }
}

/// Loads the core at `path` and runs what `options` asks for: the
/// qualification check, then the decode bench.
pub fn check_core(path: &Path, options: &CheckOptions) -> Result<ReplayReport, ReplayError> {
    if options.bench_decode.is_some() {
        one_rank(path, "the decode bench")?;
    }
    let mut loaded = LoadedCore::load(path, &options.load)?;
    let core = loaded.core();
    if let Some((capacity, _)) = options.bench_decode {
        if core.graph(GraphKind::Decode, capacity).is_none() {
            return Err(ReplayError::NoDecodeGraph {
                capacity,
                available: core.contract().decode_capacities.clone(),
            });
        }
    }
    let every_page = loaded.kv_pages() == core.contract().kv_pages;
    // One per rank, rank 0's first (replayed in lockstep).
    let mut qualifications =
        if options.runs_qualification(core.qualification().is_some(), every_page) {
            loaded.check()?.into_iter().map(Some).collect()
        } else {
            vec![None; loaded.reports().len()]
        };
    let decode_bench: Option<DecodeBench> = match options.bench_decode {
        Some((capacity, steps)) => Some(loaded.bench_decode(capacity, steps)?),
        None => None,
    };
    let peers = (loaded.reports().iter().skip(1))
        .zip(qualifications.drain(1..))
        .map(|(load, qualification)| PeerReport {
            load: load.clone(),
            qualification,
        })
        .collect();
    Ok(ReplayReport {
        core: path.display().to_string(),
        load: loaded.report().clone(),
        qualification: qualifications.remove(0),
        decode_bench,
        peers,
    })
}

/// Loads the core at `path` on device `device` with every prepared KV page
/// backed and runs its qualification node by node
/// ([`LoadedCore::isolate`]).
pub fn isolate_core(path: &Path, device: i32) -> Result<IsolationReport, ReplayError> {
    one_rank(path, "fault isolation")?;
    let load = LoadOptions {
        device,
        kv: KvBacking::Prepared,
        ..LoadOptions::default()
    };
    LoadedCore::load(path, &load)?.isolate()
}

/// Refuses a tensor-parallel core before any rank is loaded, for what runs
/// one rank alone.
fn one_rank(path: &Path, what: &'static str) -> Result<(), ReplayError> {
    super::loaded::one_rank(&crate::core::load_manifest(path)?, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::CoreError;

    #[test]
    fn the_qualification_runs_when_asked_or_before_a_bench_on_every_page() {
        let check = CheckOptions::qualification(0);
        assert!(check.runs_qualification(true, true));
        // Asked for: it runs, and refuses itself when pages are missing or
        // the core has none (LoadedCore::check's typed errors).
        assert!(check.runs_qualification(false, false));
        let bench = CheckOptions {
            qualification: false,
            bench_decode: Some((4, NonZeroU32::new(8).unwrap())),
            ..check
        };
        assert!(bench.runs_qualification(true, true));
        assert!(!bench.runs_qualification(true, false));
        assert!(!bench.runs_qualification(false, true));
    }

    #[test]
    fn an_unreadable_core_fails_before_any_cuda_work() {
        let path = Path::new("/nonexistent/tiny.core");
        let err = check_core(path, &CheckOptions::qualification(0)).unwrap_err();
        assert!(
            matches!(err, ReplayError::Core(CoreError::Io { .. })),
            "{err}"
        );
        let err = isolate_core(path, 0).unwrap_err();
        assert!(
            matches!(err, ReplayError::Core(CoreError::Io { .. })),
            "{err}"
        );
    }
}
