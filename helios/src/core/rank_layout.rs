//! The rank layout of a tensor-parallel core: the ranks besides rank 0, each
//! validated as one rank's core would be, and held to the rules that let one
//! scheduling decision run on every rank.
//!
//! - The world size is at least 2 and every rank 1 .. world_size - 1 appears
//!   exactly once.
//! - Every rank has rank 0's graph catalog: the same (kind, capacity) pairs,
//!   so a step launches the same graph on every rank.
//! - Every rank binds the contract's semantic values to buffers of the same
//!   names, shapes, strides and dtypes as rank 0's: the host packs one staging
//!   layout and one set of page and slot assignments for all of them.
//! - Windows are disjoint: every rank's window lives in one process's virtual
//!   address space.
//! - Every rank carries a qualification sequence exactly when rank 0 does, as
//!   long as rank 0's and launching the same (kind, capacity) at every step:
//!   the ranks' collectives rendezvous, so the check replays them in lockstep.
//! - Where rank 0's window holds a collectives region (the two-rank
//!   collectives' flags and buffers), every rank's holds one at the same
//!   offset and size: each rank's graphs reach its peer's at the peer's window
//!   base plus that offset. A core of one rank holds none.
//!
//! What a rank's graphs compute (its shards of the projections, its KV heads,
//! its collectives) stays in its graphs: nothing here interprets it.

use std::collections::BTreeMap;

use super::error::CoreError;
use super::kv_layout::{self, KvLayout};
use super::proto::{
    Buffer, Graph, GraphKind, PreparedContract, Qualification, RankLayout, Region, RegionKind,
    Semantic, Window,
};
use super::validate;

/// One peer rank's validated bundle.
#[derive(Debug, Clone)]
pub struct ValidRank {
    rank: u32,
    window: Window,
    buffers: Vec<Buffer>,
    graphs: Vec<Graph>,
    qualification: Option<Qualification>,
    bound: BTreeMap<Semantic, usize>,
    catalog: BTreeMap<(GraphKind, u32), usize>,
    kv_layout: Option<KvLayout>,
}

impl ValidRank {
    /// The rank's number (1 .. world_size - 1).
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The rank's fixed virtual-address window.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// The rank's buffer views.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// The rank's graphs, in manifest order.
    pub fn graphs(&self) -> &[Graph] {
        &self.graphs
    }

    /// The rank's own qualification sequence (its graph indices and
    /// buffers), present exactly when rank 0's is.
    pub fn qualification(&self) -> Option<&Qualification> {
        self.qualification.as_ref()
    }

    /// The buffer called `name` on this rank, if any.
    pub fn buffer_named(&self, name: &str) -> Option<&Buffer> {
        self.buffers.iter().find(|buffer| buffer.name == name)
    }

    /// The buffer bound to `semantic` on this rank.
    pub fn buffer(&self, semantic: Semantic) -> Option<&Buffer> {
        self.bound
            .get(&semantic)
            .and_then(|&index| self.buffers.get(index))
    }

    /// Which buffer each semantic value is bound to, by position.
    pub(crate) fn bound(&self) -> &BTreeMap<Semantic, usize> {
        &self.bound
    }

    /// The graph of `kind` at exactly `capacity` on this rank.
    pub fn graph(&self, kind: GraphKind, capacity: u32) -> Option<&Graph> {
        self.catalog
            .get(&(kind, capacity))
            .and_then(|&index| self.graphs.get(index))
    }

    /// The rank's KV pages buffer as slabs of pages.
    pub fn kv_layout(&self) -> Option<&KvLayout> {
        self.kv_layout.as_ref()
    }

    pub(crate) fn into_bundle(self) -> super::proto::RankBundle {
        super::proto::RankBundle {
            rank: self.rank,
            window: Some(self.window),
            buffers: self.buffers,
            graphs: self.graphs,
            qualification: self.qualification,
        }
    }
}

/// Rank 0's validated facts the peers are held to.
pub(crate) struct RankZero<'a> {
    pub window: &'a Window,
    pub buffers: &'a [Buffer],
    pub graphs: &'a [Graph],
    pub qualification: Option<&'a Qualification>,
    pub catalog: &'a BTreeMap<(GraphKind, u32), usize>,
    pub bound: &'a BTreeMap<Semantic, usize>,
}

fn invalid(reason: String) -> CoreError {
    CoreError::RankLayout { reason }
}

fn graph_name((kind, capacity): &(GraphKind, u32)) -> String {
    format!("{}@{capacity}", kind.as_str_name())
}

/// The window's collectives region, if any; two are refused.
pub(crate) fn collectives_region(window: &Window) -> Result<Option<&Region>, CoreError> {
    let mut found =
        (window.regions.iter()).filter(|region| region.kind == RegionKind::Collectives as i32);
    let first = found.next();
    if found.next().is_some() {
        return Err(invalid(
            "a window holds two collectives regions; a rank has one".to_owned(),
        ));
    }
    Ok(first)
}

/// A core of one rank: no collectives region (no peer would read it).
pub(crate) fn check_no_collectives(window: &Window) -> Result<(), CoreError> {
    match collectives_region(window)? {
        None => Ok(()),
        Some(_) => Err(invalid(
            "the window holds a collectives region, but the core has no rank layout \
             (one rank has no peer to exchange with)"
                .to_owned(),
        )),
    }
}

/// Every rank's collectives region at rank 0's offset and size, or none on
/// any rank.
fn check_collectives(zero: &Window, peers: &[ValidRank]) -> Result<(), CoreError> {
    let ours = collectives_region(zero)?.map(|region| (region.offset, region.size));
    for peer in peers {
        let theirs = collectives_region(&peer.window)?.map(|region| (region.offset, region.size));
        if theirs != ours {
            let show = |place: Option<(u64, u64)>| match place {
                Some((offset, size)) => format!("at offset {offset:#x}, {size} bytes"),
                None => "none".to_owned(),
            };
            return Err(invalid(format!(
                "rank {}'s collectives region ({}) is not rank 0's ({}): a rank reaches its \
                 peer's at the same offset in the peer's window",
                peer.rank,
                show(theirs),
                show(ours)
            )));
        }
    }
    Ok(())
}

/// A validated rank layout: the peers in rank order, and where the
/// collectives' wait limit lies in each rank's collectives region.
pub(crate) struct ValidLayout {
    pub peers: Vec<ValidRank>,
    pub wait_limit_offset: Option<u64>,
}

/// Validates `layout` against rank 0.
pub(crate) fn check_rank_layout(
    layout: RankLayout,
    zero: &RankZero<'_>,
    contract: &PreparedContract,
    images: &std::collections::HashSet<&str>,
) -> Result<ValidLayout, CoreError> {
    let RankLayout {
        world_size,
        peers,
        collectives_wait_limit_offset,
    } = layout;
    if world_size < 2 {
        return Err(invalid(format!(
            "world_size {world_size}: a core of one rank has no rank layout"
        )));
    }
    let mut by_rank: BTreeMap<u32, super::proto::RankBundle> = BTreeMap::new();
    for peer in peers {
        let rank = peer.rank;
        if rank == 0 || rank >= world_size {
            return Err(invalid(format!(
                "rank {rank} is outside 1..{world_size} (rank 0 is the core's own bundle)"
            )));
        }
        if by_rank.insert(rank, peer).is_some() {
            return Err(invalid(format!("rank {rank} appears twice")));
        }
    }
    if let Some(missing) = (1..world_size).find(|rank| !by_rank.contains_key(rank)) {
        return Err(invalid(format!(
            "rank {missing} of {world_size} is missing"
        )));
    }
    let mut ranks = Vec::with_capacity(by_rank.len());
    for (rank, bundle) in by_rank {
        let peer =
            check_bundle(rank, bundle, contract, images).map_err(|source| CoreError::InRank {
                rank,
                source: Box::new(source),
            })?;
        check_agreement(&peer, zero)?;
        ranks.push(peer);
    }
    let mut windows: Vec<(u32, u64, u64)> = std::iter::once((0, zero.window))
        .chain(ranks.iter().map(|peer| (peer.rank, &peer.window)))
        .map(|(rank, window)| (rank, window.base, window.base.saturating_add(window.size)))
        .collect();
    windows.sort_by_key(|&(_, start, _)| start);
    for pair in windows.windows(2) {
        let ((a, _, a_end), (b, b_start, _)) = (pair[0], pair[1]);
        if b_start < a_end {
            return Err(invalid(format!(
                "the windows of rank {a} and rank {b} overlap"
            )));
        }
    }
    check_collectives(zero.window, &ranks)?;
    check_wait_limit(zero.window, collectives_wait_limit_offset)?;
    Ok(ValidLayout {
        peers: ranks,
        wait_limit_offset: collectives_wait_limit_offset,
    })
}

/// The wait limit's word lies whole, aligned, inside the collectives region
/// (the same on every rank, checked above).
fn check_wait_limit(zero: &Window, offset: Option<u64>) -> Result<(), CoreError> {
    let Some(offset) = offset else {
        return Ok(());
    };
    let Some(region) = collectives_region(zero)? else {
        return Err(invalid(
            "the layout names a collectives wait limit, but no window holds a collectives \
             region"
                .to_owned(),
        ));
    };
    let inside = offset.checked_add(8).is_some_and(|end| end <= region.size);
    if !offset.is_multiple_of(8) || !inside {
        return Err(invalid(format!(
            "the collectives wait limit at offset {offset:#x} is not an aligned 8-byte word \
             inside the {}-byte collectives region",
            region.size
        )));
    }
    Ok(())
}

/// One peer's window, buffers, graphs and bindings, as a one-rank core's.
fn check_bundle(
    rank: u32,
    bundle: super::proto::RankBundle,
    contract: &PreparedContract,
    images: &std::collections::HashSet<&str>,
) -> Result<ValidRank, CoreError> {
    let window = bundle
        .window
        .ok_or(CoreError::Missing { field: "window" })?;
    validate::check_window(&window)?;
    let names = validate::check_buffers(&bundle.buffers, window.size)?;
    let catalog = validate::check_graphs(&bundle.graphs, images, &window)?;
    let kv_layout = kv_layout::check_kv_layout(contract, &bundle.buffers, &window.regions)?;
    let bound = validate::check_bindings(&contract.bindings, &names)?;
    if let Some(qualification) = &bundle.qualification {
        validate::check_qualification(qualification, bundle.graphs.len(), &bundle.buffers, &names)?;
    }
    drop(names);
    Ok(ValidRank {
        rank,
        window,
        buffers: bundle.buffers,
        graphs: bundle.graphs,
        qualification: bundle.qualification,
        bound,
        catalog,
        kv_layout,
    })
}

/// The catalog and the bound buffers' views equal rank 0's.
fn check_agreement(peer: &ValidRank, zero: &RankZero<'_>) -> Result<(), CoreError> {
    let rank = peer.rank;
    if let Some(key) = (zero.catalog.keys()).find(|key| !peer.catalog.contains_key(key)) {
        return Err(invalid(format!(
            "rank {rank} lacks rank 0's graph {}",
            graph_name(key)
        )));
    }
    if let Some(key) = (peer.catalog.keys()).find(|key| !zero.catalog.contains_key(key)) {
        return Err(invalid(format!(
            "rank {rank} has graph {}, which rank 0 lacks",
            graph_name(key)
        )));
    }
    check_lockstep(peer, zero)?;
    for (semantic, &index) in zero.bound {
        let ours = &zero.buffers[index];
        let theirs = peer
            .buffer(*semantic)
            .expect("bindings were checked on the peer");
        let same = ours.name == theirs.name
            && ours.dtype == theirs.dtype
            && ours.shape == theirs.shape
            && ours.strides == theirs.strides;
        if !same {
            return Err(invalid(format!(
                "rank {rank} binds {} to a buffer other than rank 0's view \
                 ({:?} {:?} against {:?} {:?})",
                semantic.as_str_name(),
                theirs.name,
                theirs.shape,
                ours.name,
                ours.shape
            )));
        }
    }
    Ok(())
}

/// The (kind, capacity) of the graph a qualification step launches.
fn launched(graphs: &[Graph], graph: u32) -> (GraphKind, u32) {
    let graph = &graphs[graph as usize];
    (
        GraphKind::try_from(graph.kind).unwrap_or_default(),
        graph.capacity,
    )
}

/// The peer's qualification sequence replays in lockstep with rank 0's: both
/// or neither recorded, as long, the same graph launched at every step.
fn check_lockstep(peer: &ValidRank, zero: &RankZero<'_>) -> Result<(), CoreError> {
    let rank = peer.rank;
    let (ours, theirs) = match (zero.qualification, &peer.qualification) {
        (None, None) => return Ok(()),
        (Some(ours), Some(theirs)) => (ours, theirs),
        (ours, _) => {
            let (with, without) = if ours.is_some() {
                ("rank 0".to_owned(), format!("rank {rank}"))
            } else {
                (format!("rank {rank}"), "rank 0".to_owned())
            };
            return Err(invalid(format!(
                "{with} carries a qualification sequence and {without} none: every rank \
                 replays its own in lockstep"
            )));
        }
    };
    if ours.steps.len() != theirs.steps.len() {
        return Err(invalid(format!(
            "rank {rank}'s qualification has {} steps, rank 0's {}: the ranks replay in lockstep",
            theirs.steps.len(),
            ours.steps.len()
        )));
    }
    for (index, (a, b)) in ours.steps.iter().zip(&theirs.steps).enumerate() {
        let (a, b) = (
            launched(zero.graphs, a.graph),
            launched(&peer.graphs, b.graph),
        );
        if a != b {
            return Err(invalid(format!(
                "qualification step {index} launches {} on rank {rank} but {} on rank 0: the \
                 ranks' collectives rendezvous, so every step launches the same graph",
                graph_name(&b),
                graph_name(&a)
            )));
        }
    }
    Ok(())
}
