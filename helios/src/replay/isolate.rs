//! Fault isolation: the qualification sequence with every graph node run
//! alone, to name the first node the device rejects.
//!
//! A kernel that faults (illegal instruction, illegal address) poisons the
//! CUDA context, so only the first failure can be observed in a process.
//! [`isolate`] runs the recorded steps with each graph's nodes launched one at
//! a time, as single-node graphs in a topological order of the graph's edges,
//! waiting after each: the node that fails first is the culprit, and the
//! report describes it (function, image, launch shape, parameters, cluster).

use serde::Serialize;

use super::error::ReplayError;
use super::qualify::{locate, ReplayDevice};
use crate::core::proto::{node::Op, Graph, GraphKind, Node};
use crate::core::ValidCore;

/// A device that can run one node of a manifest graph by itself.
pub trait NodeDevice: ReplayDevice {
    /// Builds a graph holding only `graph.nodes[node]`, launches it and waits
    /// for it.
    fn run_node(&mut self, graph: &Graph, node: usize) -> Result<(), ReplayError>;
}

/// What a node is, for a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSummary {
    /// Position of the node in its graph.
    pub index: usize,
    /// `kernel`, `memset`, `memcpy`, `empty` or `none`.
    pub op: &'static str,
    /// Kernel function name (kernels only).
    pub function: String,
    /// Kernel image digest (kernels only).
    pub image: String,
    /// Grid and block dimensions (kernels only).
    pub grid: [u32; 3],
    /// Block dimensions (kernels only).
    pub block: [u32; 3],
    /// Dynamic shared memory bytes (kernels only).
    pub dynamic_shared_bytes: u32,
    /// Parameter bytes, and whether they come as one `extra` block.
    pub param_bytes: usize,
    /// Whether the parameters are passed as an `extra` block.
    pub params_from_extra: bool,
    /// Recorded cluster dimension.
    pub cluster: [u32; 3],
}

fn dim(d: Option<&crate::core::proto::Dim3>) -> [u32; 3] {
    d.map_or([0; 3], |d| [d.x, d.y, d.z])
}

impl NodeSummary {
    /// Describes `node`, the `index`th of its graph.
    pub fn of(index: usize, node: &Node) -> Self {
        let mut summary = Self {
            index,
            op: "none",
            function: String::new(),
            image: String::new(),
            grid: [0; 3],
            block: [0; 3],
            dynamic_shared_bytes: 0,
            param_bytes: 0,
            params_from_extra: false,
            cluster: [0; 3],
        };
        match &node.op {
            Some(Op::Kernel(k)) => {
                summary.op = "kernel";
                summary.function.clone_from(&k.function);
                summary.image.clone_from(&k.image_sha256);
                summary.grid = dim(k.grid.as_ref());
                summary.block = dim(k.block.as_ref());
                summary.dynamic_shared_bytes = k.dynamic_shared_bytes;
                summary.param_bytes = k.params.len();
                summary.params_from_extra = k.params_from_extra;
                summary.cluster = dim(k.cluster.as_ref());
            }
            Some(Op::Memset(_)) => summary.op = "memset",
            Some(Op::Memcpy(_)) => summary.op = "memcpy",
            Some(Op::Empty(_)) => summary.op = "empty",
            None => {}
        }
        summary
    }
}

/// The first node the device rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeFailure {
    /// Qualification step.
    pub step: usize,
    /// Position of the graph in the manifest.
    pub graph: usize,
    /// The graph's kind.
    pub kind: &'static str,
    /// The graph's capacity.
    pub capacity: u32,
    /// How many nodes of this step ran before it.
    pub nodes_before: usize,
    /// The node.
    pub node: NodeSummary,
    /// The device's error.
    pub error: String,
}

/// The outcome of [`isolate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IsolationReport {
    /// Steps whose nodes all ran.
    pub steps_run: usize,
    /// Nodes run in all.
    pub nodes_run: usize,
    /// The first failure, if any.
    pub failure: Option<NodeFailure>,
}

impl IsolationReport {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }
}

/// Node positions of `graph` in a topological order of its edges (Kahn's
/// algorithm, lowest position first among ready nodes).
pub fn topological_order(graph: &Graph) -> Result<Vec<usize>, ReplayError> {
    let count = graph.nodes.len();
    let mut indegree = vec![0usize; count];
    let mut successors = vec![Vec::new(); count];
    for edge in &graph.edges {
        let (from, to) = (edge.from as usize, edge.to as usize);
        if from >= count || to >= count {
            return Err(ReplayError::Isolation {
                reason: format!("edge {from} -> {to} names a node past {count}"),
            });
        }
        successors[from].push(to);
        indegree[to] += 1;
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..count).filter(|&n| indegree[n] == 0).collect();
    let mut order = Vec::with_capacity(count);
    while let Some(node) = ready.pop_first() {
        order.push(node);
        for &next in &successors[node] {
            indegree[next] -= 1;
            if indegree[next] == 0 {
                ready.insert(next);
            }
        }
    }
    if order.len() != count {
        return Err(ReplayError::Isolation {
            reason: "the graph's edges form a cycle".to_owned(),
        });
    }
    Ok(order)
}

/// Runs `core`'s qualification steps on `device` (freshly loaded) with every
/// node alone, stopping at the first node the device rejects.
pub fn isolate<D: NodeDevice>(
    core: &ValidCore,
    device: &mut D,
) -> Result<IsolationReport, ReplayError> {
    let qualification = core.qualification().ok_or(ReplayError::NoQualification)?;
    let mut report = IsolationReport {
        steps_run: 0,
        nodes_run: 0,
        failure: None,
    };
    for (index, step) in qualification.steps.iter().enumerate() {
        for write in &step.writes {
            let (addr, _) = locate(core.view(), &write.buffer)?;
            device.write(addr + write.offset, &write.data)?;
        }
        let graph_index = step.graph as usize;
        let graph = core.graphs().get(graph_index).ok_or(ReplayError::NoGraph {
            index: graph_index,
            count: core.graphs().len(),
        })?;
        for (ran, node) in topological_order(graph)?.into_iter().enumerate() {
            if let Err(error) = device.run_node(graph, node) {
                report.failure = Some(NodeFailure {
                    step: index,
                    graph: graph_index,
                    kind: GraphKind::try_from(graph.kind)
                        .unwrap_or_default()
                        .as_str_name(),
                    capacity: graph.capacity,
                    nodes_before: ran,
                    node: NodeSummary::of(node, &graph.nodes[node]),
                    error: error.to_string(),
                });
                return Ok(report);
            }
            report.nodes_run += 1;
        }
        report.steps_run += 1;
    }
    Ok(report)
}
