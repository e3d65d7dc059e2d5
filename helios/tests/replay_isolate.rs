//! Fault isolation against a CPU fake: nodes run one at a time in a
//! topological order of each graph's edges, and the first one the device
//! rejects is named with its step and graph.

use helios::core::proto::{node::Op, Edge, Graph, KernelNode, Node};
use helios::core::sample::{tiny_core, SAMPLE_WINDOW};
use helios::core::ValidCore;
use helios::cuda::CudaError;
use helios::replay::{isolate, topological_order, NodeDevice, ReplayDevice, ReplayError};

fn graph(nodes: usize, edges: &[(u32, u32)]) -> Graph {
    Graph {
        nodes: vec![Node::default(); nodes],
        edges: edges
            .iter()
            .map(|&(from, to)| Edge {
                from,
                to,
                ..Edge::default()
            })
            .collect(),
        ..Graph::default()
    }
}

#[test]
fn nodes_are_ordered_by_their_edges_lowest_first() {
    assert_eq!(topological_order(&graph(3, &[])).unwrap(), [0, 1, 2]);
    assert_eq!(
        topological_order(&graph(4, &[(3, 0), (0, 1), (3, 2), (2, 1)])).unwrap(),
        [3, 0, 2, 1]
    );
    assert!(matches!(
        topological_order(&graph(2, &[(0, 1), (1, 0)])),
        Err(ReplayError::Isolation { .. })
    ));
    assert!(matches!(
        topological_order(&graph(2, &[(0, 5)])),
        Err(ReplayError::Isolation { .. })
    ));
}

/// Records every node it runs; faults on one (graph kind, capacity, node).
struct FakeDevice {
    memory: Vec<u8>,
    base: u64,
    ran: Vec<(i32, u32, usize)>,
    fault: Option<(i32, u32, usize)>,
}

impl ReplayDevice for FakeDevice {
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ReplayError> {
        let at = (addr - self.base) as usize;
        self.memory[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn launch(&mut self, _graph: usize) -> Result<(), ReplayError> {
        panic!("isolation never launches whole graphs")
    }
    fn synchronize(&mut self) -> Result<(), ReplayError> {
        Ok(())
    }
    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ReplayError> {
        let at = (addr - self.base) as usize;
        out.copy_from_slice(&self.memory[at..at + out.len()]);
        Ok(())
    }
    fn free_memory(&mut self) -> Result<u64, ReplayError> {
        Ok(0)
    }
    fn time_back_to_back(&mut self, _: usize, _: u32) -> Result<f64, ReplayError> {
        Ok(0.0)
    }
}

impl NodeDevice for FakeDevice {
    fn run_node(&mut self, graph: &Graph, node: usize) -> Result<(), ReplayError> {
        let key = (graph.kind, graph.capacity, node);
        if self.fault == Some(key) {
            return Err(CudaError::InvalidNode {
                reason: "illegal instruction".to_owned(),
            }
            .into());
        }
        self.ran.push(key);
        Ok(())
    }
}

fn device(core: &ValidCore, fault: Option<(i32, u32, usize)>) -> FakeDevice {
    FakeDevice {
        memory: vec![0; SAMPLE_WINDOW as usize],
        base: core.window().base,
        ran: Vec::new(),
        fault,
    }
}

#[test]
fn every_node_of_every_step_runs_when_none_faults() {
    let core = ValidCore::new(tiny_core()).unwrap();
    let mut fake = device(&core, None);
    let report = isolate(&core, &mut fake).unwrap();
    let graph = &core.graphs()[0];
    assert!(report.failure.is_none());
    assert_eq!(report.steps_run, 1);
    assert_eq!(report.nodes_run, graph.nodes.len());
    // The sample graph's edge 0 -> 1 keeps node 0 first.
    assert_eq!(fake.ran[0], (graph.kind, graph.capacity, 0));
    // The step's write reached memory.
    assert_eq!(fake.memory.iter().filter(|&&b| b != 0).count(), 1);
}

#[test]
fn the_first_faulting_node_is_named() {
    let mut core = tiny_core();
    core.graphs[0].nodes[1] = Node {
        op: Some(Op::Kernel(KernelNode {
            function: "faulty".to_owned(),
            ..core.graphs[0].nodes[1]
                .op
                .clone()
                .and_then(|op| match op {
                    Op::Kernel(k) => Some(k),
                    _ => None,
                })
                .unwrap_or_default()
        })),
    };
    let core = ValidCore::new(core).unwrap();
    let graph = &core.graphs()[0];
    let mut fake = device(&core, Some((graph.kind, graph.capacity, 1)));
    let report = isolate(&core, &mut fake).unwrap();
    let failure = report.failure.expect("node 1 faults");
    assert_eq!(
        (failure.step, failure.graph, failure.nodes_before),
        (0, 0, 1)
    );
    assert_eq!(failure.node.index, 1);
    assert_eq!(failure.node.op, "kernel");
    assert_eq!(failure.node.function, "faulty");
    assert!(failure.error.contains("illegal instruction"));
    assert_eq!(report.steps_run, 0);
}
