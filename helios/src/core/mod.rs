//! The runtime core's manifest: decoding, validation and typed access.
//!
//! A runtime core is a directory exported by Ignition whose `manifest.pb` is a
//! binary `flare.core.v1.Core` message (`proto/flare_core.proto`). Helios
//! treats it as untrusted input: [`decode_manifest`] and [`load_manifest`]
//! decode it and check it structurally, before any CUDA work, and hand back a
//! [`ValidCore`] whose accessors can rely on what was checked.

mod error;
mod kv_layout;
pub mod proto;
mod rank_layout;
#[cfg(any(test, feature = "test-support"))]
pub mod sample;
mod summary;
mod validate;

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;

pub use error::{CoreError, KvAxisProblem};
pub use kv_layout::{KvLayout, MAX_KV_SLABS};
/// The `prost` version the manifest types are generated with, for crates that
/// encode or decode them without depending on `prost` themselves.
pub use prost;
pub use rank_layout::ValidRank;
pub use summary::{
    ContractSummary, CoreSummary, FrontendSummary, GraphKindSummary, RegionSummary, RoleSummary,
};
pub use validate::{all_semantics, required_semantics, OPTIONAL_SEMANTICS};

use proto::{
    Buffer, ContinuationState, Core, Frontend, Graph, GraphKind, Identity, KernelImage,
    PreparedContract, Qualification, SamplingDefaults, Semantic, Window,
};

/// The execution ABI this engine implements. Cores exported for any ABI up to
/// this one load; newer ones are rejected.
pub const ENGINE_ABI: u32 = 1;

/// File name of the manifest inside a core directory.
pub const MANIFEST_FILE: &str = "manifest.pb";

/// Decodes and validates a binary `flare.core.v1.Core` manifest.
pub fn decode_manifest(bytes: &[u8]) -> Result<ValidCore, CoreError> {
    ValidCore::new(Core::decode(bytes)?)
}

/// Reads `core_dir/manifest.pb`, then decodes and validates it.
pub fn load_manifest(core_dir: &Path) -> Result<ValidCore, CoreError> {
    let path = core_dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).map_err(|source| CoreError::Io { path, source })?;
    decode_manifest(&bytes)
}

/// A decoded manifest that passed validation.
///
/// The required messages (identity, window, contract, frontend and its
/// sampling defaults) are present, every semantic value is bound to exactly
/// one existing buffer, and the graph catalog holds every graph the contract
/// needs.
#[derive(Debug, Clone)]
pub struct ValidCore {
    abi_version: u32,
    identity: Identity,
    window: Window,
    buffers: Vec<Buffer>,
    images: Vec<KernelImage>,
    graphs: Vec<Graph>,
    contract: PreparedContract,
    frontend: Frontend,
    sampling: SamplingDefaults,
    qualification: Option<Qualification>,
    bound: BTreeMap<Semantic, usize>,
    catalog: BTreeMap<(GraphKind, u32), usize>,
    kv_layout: Option<KvLayout>,
    /// Ranks 1 .. world_size - 1 of a tensor-parallel core, in rank order.
    peers: Vec<ValidRank>,
    /// Where the collectives' wait limit lies in every rank's collectives
    /// region, when the layout names it.
    wait_limit_offset: Option<u64>,
}

impl ValidCore {
    /// Validates a decoded manifest.
    pub fn new(core: Core) -> Result<Self, CoreError> {
        let Core {
            abi_version,
            identity,
            window,
            buffers,
            images,
            graphs,
            contract,
            frontend,
            qualification,
            rank_layout,
        } = core;
        validate::check_abi(abi_version)?;
        let missing = |field| CoreError::Missing { field };
        let identity = identity.ok_or(missing("identity"))?;
        let window = window.ok_or(missing("window"))?;
        let contract = contract.ok_or(missing("contract"))?;
        let frontend = frontend.ok_or(missing("frontend"))?;

        validate::check_window(&window)?;
        let names = validate::check_buffers(&buffers, window.size)?;
        let digests = validate::check_images(&images)?;
        let catalog = validate::check_graphs(&graphs, &digests, &window)?;
        validate::check_contract(&contract, &catalog)?;
        let kv_layout = kv_layout::check_kv_layout(&contract, &buffers, &window.regions)?;
        let bound = validate::check_bindings(&contract.bindings, &names)?;
        validate::check_frontend(&frontend)?;
        let sampling = frontend.sampling.ok_or(missing("frontend.sampling"))?;
        if let Some(qualification) = &qualification {
            validate::check_qualification(qualification, graphs.len(), &buffers, &names)?;
        }
        let (peers, wait_limit_offset) = match rank_layout {
            None => {
                rank_layout::check_no_collectives(&window)?;
                (Vec::new(), None)
            }
            Some(layout) => {
                let zero = rank_layout::RankZero {
                    window: &window,
                    buffers: &buffers,
                    graphs: &graphs,
                    qualification: qualification.as_ref(),
                    catalog: &catalog,
                    bound: &bound,
                };
                let layout = rank_layout::check_rank_layout(layout, &zero, &contract, &digests)?;
                (layout.peers, layout.wait_limit_offset)
            }
        };

        Ok(Self {
            abi_version,
            identity,
            window,
            buffers,
            images,
            graphs,
            contract,
            frontend,
            sampling,
            qualification,
            bound,
            catalog,
            kv_layout,
            peers,
            wait_limit_offset,
        })
    }

    /// Where, from the start of every rank's collectives region, the
    /// collectives' wait limit lies (an int64 of nanoseconds a loader writes;
    /// 0 waits forever), when the rank layout names it.
    pub fn collectives_wait_limit_offset(&self) -> Option<u64> {
        self.wait_limit_offset
    }

    /// Rank `rank`'s part of the core (rank 0's is the core's own window,
    /// buffers and graphs), or `None` past the world size.
    pub fn rank(&self, rank: u32) -> Option<RankView<'_>> {
        if rank == 0 {
            return Some(RankView {
                rank,
                window: &self.window,
                buffers: &self.buffers,
                bound: &self.bound,
                graphs: &self.graphs,
                qualification: self.qualification.as_ref(),
                kv_layout: self.kv_layout.as_ref(),
                contract: &self.contract,
            });
        }
        let peer = self.peers.get(rank as usize - 1)?;
        Some(RankView {
            rank,
            window: peer.window(),
            buffers: peer.buffers(),
            bound: peer.bound(),
            graphs: peer.graphs(),
            qualification: peer.qualification(),
            kv_layout: peer.kv_layout(),
            contract: &self.contract,
        })
    }

    /// Rank 0's part: the core's own window, buffers and graphs.
    pub fn view(&self) -> RankView<'_> {
        self.rank(0).expect("every core has rank 0")
    }

    /// Every rank's part, in rank order (one for a one-rank core).
    pub fn ranks(&self) -> Vec<RankView<'_>> {
        (0..self.world_size())
            .filter_map(|rank| self.rank(rank))
            .collect()
    }

    /// Ranks the core was prepared for: 1, or its rank layout's world size.
    pub fn world_size(&self) -> u32 {
        1 + self.peers.len() as u32
    }

    /// Ranks 1 .. world_size - 1 (empty for a one-rank core); rank 0 is the
    /// core's own window, buffers and graphs.
    pub fn peers(&self) -> &[ValidRank] {
        &self.peers
    }

    /// The execution ABI the core was exported for (at most [`ENGINE_ABI`]).
    pub fn abi_version(&self) -> u32 {
        self.abi_version
    }

    /// What was prepared, from what, on which device.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The fixed virtual-address window and its regions.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Every buffer, in manifest order.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Every kernel image, in manifest order.
    pub fn images(&self) -> &[KernelImage] {
        &self.images
    }

    /// Every recorded graph, in manifest order.
    pub fn graphs(&self) -> &[Graph] {
        &self.graphs
    }

    /// How the graphs may be driven.
    pub fn contract(&self) -> &PreparedContract {
        &self.contract
    }

    /// What a request's state holds besides its sampling parameters: K/V pages
    /// alone ([`ContinuationState::PositionalKv`]), or further state that exists
    /// only at the live end (`ContinuationRows`, also what an older core that does
    /// not declare it gets).
    pub fn continuation(&self) -> ContinuationState {
        match ContinuationState::try_from(self.contract.continuation) {
            Ok(ContinuationState::PositionalKv) => ContinuationState::PositionalKv,
            _ => ContinuationState::ContinuationRows,
        }
    }

    /// Tokenizer, chat template, stop tokens, sampling defaults and parsers.
    pub fn frontend(&self) -> &Frontend {
        &self.frontend
    }

    /// The default sampling parameters and their allowed ranges.
    pub fn sampling(&self) -> &SamplingDefaults {
        &self.sampling
    }

    /// The recorded qualification sequence, when the core carries one.
    pub fn qualification(&self) -> Option<&Qualification> {
        self.qualification.as_ref()
    }

    /// The buffer bound to `semantic`. Every semantic value is bound, so this
    /// is `None` only for [`Semantic::Unspecified`].
    pub fn buffer(&self, semantic: Semantic) -> Option<&Buffer> {
        self.view().buffer(semantic)
    }

    /// Whether the sampling graphs take token masks (the core binds
    /// [`OPTIONAL_SEMANTICS`]): only then can decoding be constrained.
    pub fn takes_token_masks(&self) -> bool {
        self.view().takes_token_masks()
    }

    /// The buffer called `name`, if any.
    pub fn buffer_named(&self, name: &str) -> Option<&Buffer> {
        self.view().buffer_named(name)
    }

    /// The graph recorded for `kind` at `capacity`, if any. Every decode and
    /// prefill capacity of the contract has one, and resume, admit, snapshot
    /// and restore have one at capacity 1.
    pub fn graph(&self, kind: GraphKind, capacity: u32) -> Option<&Graph> {
        self.catalog
            .get(&(kind, capacity))
            .and_then(|&position| self.graphs.get(position))
    }

    /// The smallest decode capacity that holds `rows` rows, or `None` when
    /// `rows` exceeds `max_concurrency`.
    pub fn decode_capacity_for(&self, rows: u32) -> Option<u32> {
        smallest_at_least(&self.contract.decode_capacities, rows)
    }

    /// The smallest prefill capacity that holds `tokens` tokens, or `None`
    /// when `tokens` exceeds `prefill_chunk_size`.
    pub fn prefill_capacity_for(&self, tokens: u32) -> Option<u32> {
        smallest_at_least(&self.contract.prefill_capacities, tokens)
    }

    /// Where the KV pages lie, when the contract names `kv_page_axis`: then
    /// pages `[0, n)` of every slab can be backed alone. `None` for cores
    /// exported before the axis existed.
    pub fn kv_layout(&self) -> Option<&KvLayout> {
        self.kv_layout.as_ref()
    }

    /// Facts about the core for display, as `flare inspect` prints them.
    pub fn summary(&self) -> CoreSummary {
        CoreSummary::of(self)
    }

    /// Gives back the decoded manifest.
    pub fn into_core(self) -> Core {
        Core {
            abi_version: self.abi_version,
            identity: Some(self.identity),
            window: Some(self.window),
            buffers: self.buffers,
            images: self.images,
            graphs: self.graphs,
            contract: Some(self.contract),
            frontend: Some(self.frontend),
            qualification: self.qualification,
            rank_layout: (!self.peers.is_empty()).then(|| proto::RankLayout {
                world_size: 1 + self.peers.len() as u32,
                peers: self.peers.into_iter().map(ValidRank::into_bundle).collect(),
                collectives_wait_limit_offset: self.wait_limit_offset,
            }),
        }
    }
}

/// One rank's part of a validated core: its window, buffers, graphs, KV
/// layout and qualification sequence, with the contract every rank shares.
/// What loading and replaying a rank needs, the same for rank 0 (the core's
/// own) and a peer of its rank layout.
#[derive(Debug, Clone, Copy)]
pub struct RankView<'a> {
    rank: u32,
    window: &'a Window,
    buffers: &'a [Buffer],
    bound: &'a BTreeMap<Semantic, usize>,
    graphs: &'a [Graph],
    qualification: Option<&'a Qualification>,
    kv_layout: Option<&'a KvLayout>,
    contract: &'a PreparedContract,
}

impl<'a> RankView<'a> {
    /// The rank's number (0 for the core's own part).
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The rank's fixed virtual-address window.
    pub fn window(&self) -> &'a Window {
        self.window
    }

    /// The rank's buffers, in manifest order.
    pub fn buffers(&self) -> &'a [Buffer] {
        self.buffers
    }

    /// The rank's graphs, in manifest order.
    pub fn graphs(&self) -> &'a [Graph] {
        self.graphs
    }

    /// The rank's qualification sequence, when the core carries one.
    pub fn qualification(&self) -> Option<&'a Qualification> {
        self.qualification
    }

    /// The rank's KV pages buffer as slabs of pages (see
    /// [`ValidCore::kv_layout`]).
    pub fn kv_layout(&self) -> Option<&'a KvLayout> {
        self.kv_layout
    }

    /// The contract every rank shares.
    pub fn contract(&self) -> &'a PreparedContract {
        self.contract
    }

    /// The rank's collectives region (a tensor-parallel rank's; validation
    /// allows at most one).
    pub fn collectives_region(&self) -> Option<&'a proto::Region> {
        rank_layout::collectives_region(self.window).ok().flatten()
    }

    /// The rank's buffer called `name`, if any.
    pub fn buffer_named(&self, name: &str) -> Option<&'a Buffer> {
        self.buffers.iter().find(|buffer| buffer.name == name)
    }

    /// The rank's buffer bound to `semantic` (every rank binds the same
    /// semantics to views of the same name, shape and dtype).
    pub fn buffer(&self, semantic: Semantic) -> Option<&'a Buffer> {
        self.bound
            .get(&semantic)
            .and_then(|&position| self.buffers.get(position))
    }

    /// Whether the sampling graphs take token masks (see
    /// [`ValidCore::takes_token_masks`]).
    pub fn takes_token_masks(&self) -> bool {
        OPTIONAL_SEMANTICS
            .iter()
            .all(|semantic| self.bound.contains_key(semantic))
    }
}

/// Capacity lists are validated strictly ascending.
fn smallest_at_least(capacities: &[u32], wanted: u32) -> Option<u32> {
    capacities
        .iter()
        .copied()
        .find(|&capacity| capacity >= wanted)
}
