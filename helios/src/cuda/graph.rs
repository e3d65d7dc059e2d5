//! A CUDA graph rebuilt from a manifest `Graph`, and its executable form.
//!
//! Nodes are added in manifest order without dependencies, then every edge is
//! added with its edge data (ports and type: a programmatic edge must stay
//! programmatic). Memset and memcpy nodes hold absolute addresses, checked to
//! lie in the window's mapped memory before the driver sees them; kernel
//! parameters cannot be checked (they are opaque bytes) and rely on the
//! export's refusal of pointers outside the window.

use std::ptr;
use std::rc::Rc;

use cudarc::driver::sys;

use super::context::Context;
use super::error::{check, CudaError};
use super::module::Modules;
use super::params::KernelArgs;
use super::stream::Stream;
use super::window::Window;
use crate::core::proto::{self, node::Op, Dim3, Edge, KernelNode, MemcpyNode, MemsetNode};

/// Bytes a memset node touches from its `dst`: `(height - 1) * pitch + width
/// * element_size`, with the node's values checked.
pub fn memset_extent(memset: &MemsetNode) -> Result<u64, String> {
    if !matches!(memset.element_size, 1 | 2 | 4) {
        return Err(format!(
            "memset element size {} is not 1, 2 or 4",
            memset.element_size
        ));
    }
    if memset.width == 0 || memset.height == 0 {
        return Err("memset of zero width or height".to_owned());
    }
    let overflow = || "memset extent overflows".to_owned();
    let row = memset
        .width
        .checked_mul(u64::from(memset.element_size))
        .ok_or_else(overflow)?;
    if memset.height > 1 && memset.pitch < row {
        return Err(format!(
            "memset pitch {} is below its row of {row} bytes",
            memset.pitch
        ));
    }
    (memset.height - 1)
        .checked_mul(memset.pitch)
        .and_then(|rows| rows.checked_add(row))
        .ok_or_else(overflow)
}

/// The driver's edge data for `edges`, or `None` when every edge is a plain
/// dependency (all ports and types 0).
pub fn edge_data(edges: &[Edge]) -> Result<Option<Vec<sys::CUgraphEdgeData>>, CudaError> {
    if edges
        .iter()
        .all(|e| e.from_port == 0 && e.to_port == 0 && e.r#type == 0)
    {
        return Ok(None);
    }
    let byte = |edge: usize, value: u32, reason| {
        u8::try_from(value).map_err(|_| CudaError::InvalidEdge { edge, reason })
    };
    edges
        .iter()
        .enumerate()
        .map(|(index, e)| {
            Ok(sys::CUgraphEdgeData {
                from_port: byte(index, e.from_port, "from_port does not fit in a byte")?,
                to_port: byte(index, e.to_port, "to_port does not fit in a byte")?,
                type_: byte(index, e.r#type, "type does not fit in a byte")?,
                reserved: [0; 5],
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Whether a recorded cluster dimension asks for a cluster launch. The driver
/// reports (1, 1, 1) for a kernel launched without clusters, and setting it
/// explicitly is refused (CUDA_ERROR_INVALID_CLUSTER_SIZE), so a cluster of one
/// block is no cluster; (0, 0, 0) is none; a partly-zero dimension is invalid.
pub fn cluster_launch(x: u32, y: u32, z: u32) -> Result<bool, CudaError> {
    match (x, y, z) {
        (0, 0, 0) | (1, 1, 1) => Ok(false),
        _ if x == 0 || y == 0 || z == 0 => Err(CudaError::InvalidNode {
            reason: format!("cluster dimension ({x}, {y}, {z}) has a zero axis"),
        }),
        _ => Ok(true),
    }
}

/// The driver's cluster scheduling policy for a recorded value.
fn scheduling_policy(value: u32) -> Result<sys::CUclusterSchedulingPolicy, CudaError> {
    use sys::CUclusterSchedulingPolicy as P;
    match value {
        0 => Ok(P::CU_CLUSTER_SCHEDULING_POLICY_DEFAULT),
        1 => Ok(P::CU_CLUSTER_SCHEDULING_POLICY_SPREAD),
        2 => Ok(P::CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING),
        other => Err(CudaError::InvalidNode {
            reason: format!("unknown cluster scheduling policy {other}"),
        }),
    }
}

fn to_usize(value: u64, what: &str) -> Result<usize, CudaError> {
    usize::try_from(value).map_err(|_| CudaError::InvalidNode {
        reason: format!("{what} {value} does not fit usize"),
    })
}

fn dims(dim: Option<&Dim3>) -> (u32, u32, u32) {
    dim.map_or((0, 0, 0), |d| (d.x, d.y, d.z))
}

/// A graph under construction or built; destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    context: Rc<Context>,
    raw: sys::CUgraph,
    nodes: usize,
    /// Parameter blocks of the kernel nodes, kept for the graph's life.
    args: Vec<KernelArgs>,
}

impl Graph {
    /// Builds `description`: its kernels come from `modules`, its memset and
    /// memcpy nodes must address mapped memory of `window`.
    pub fn build(
        context: &Rc<Context>,
        description: &proto::Graph,
        modules: &Modules,
        window: &Window,
    ) -> Result<Self, CudaError> {
        let mut raw: sys::CUgraph = ptr::null_mut();
        // SAFETY: the out-pointer points to a local; flags must be 0.
        check("cuGraphCreate", unsafe { sys::cuGraphCreate(&mut raw, 0) })?;
        // From here on, Drop destroys the graph on failure.
        let mut graph = Self {
            context: Rc::clone(context),
            raw,
            nodes: 0,
            args: Vec::new(),
        };
        let mut handles = Vec::with_capacity(description.nodes.len());
        for (index, node) in description.nodes.iter().enumerate() {
            let handle = graph
                .add_node(node.op.as_ref(), modules, window)
                .map_err(|err| err.at_node(index))?;
            handles.push(handle);
            graph.nodes += 1;
        }
        graph.add_edges(&description.edges, &handles)?;
        Ok(graph)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    fn add_node(
        &mut self,
        op: Option<&Op>,
        modules: &Modules,
        window: &Window,
    ) -> Result<sys::CUgraphNode, CudaError> {
        match op {
            Some(Op::Kernel(kernel)) => self.add_kernel(kernel, modules),
            Some(Op::Memset(memset)) => self.add_memset(memset, window),
            Some(Op::Memcpy(memcpy)) => self.add_memcpy(memcpy, window),
            Some(Op::Empty(_)) => self.add_empty(),
            None => Err(CudaError::InvalidNode {
                reason: "the node has no op".to_owned(),
            }),
        }
    }

    fn add_kernel(
        &mut self,
        kernel: &KernelNode,
        modules: &Modules,
    ) -> Result<sys::CUgraphNode, CudaError> {
        let function = modules.function(&kernel.image_sha256, &kernel.function)?;
        // Function attributes first: adding a node whose launch needs them
        // fails without.
        if kernel.max_dynamic_shared_bytes > 0 {
            function.set_max_dynamic_shared_bytes(kernel.max_dynamic_shared_bytes)?;
        }
        if kernel.non_portable_cluster_size_allowed {
            function.allow_non_portable_cluster_size()?;
        }
        let mut args = KernelArgs::new(
            kernel.params.clone(),
            &kernel.param_offsets,
            &kernel.param_sizes,
            kernel.params_from_extra,
        )?;
        let (grid_x, grid_y, grid_z) = dims(kernel.grid.as_ref());
        let (block_x, block_y, block_z) = dims(kernel.block.as_ref());
        let kernel_params = args.kernel_params();
        let extra = args.extra();
        let params = sys::CUDA_KERNEL_NODE_PARAMS {
            func: function.raw(),
            gridDimX: grid_x,
            gridDimY: grid_y,
            gridDimZ: grid_z,
            blockDimX: block_x,
            blockDimY: block_y,
            blockDimZ: block_z,
            sharedMemBytes: kernel.dynamic_shared_bytes,
            kernelParams: kernel_params,
            extra,
            kern: ptr::null_mut(),
            ctx: ptr::null_mut(),
        };
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: `params` points to a live function; its parameter arrays
        // point into `args`, alive (and unmoved) during the call, which
        // copies the values.
        check("cuGraphAddKernelNode", unsafe {
            sys::cuGraphAddKernelNode_v2(&mut node, self.raw, ptr::null(), 0, &params)
        })?;
        self.args.push(args);

        let (x, y, z) = dims(kernel.cluster.as_ref());
        let clustered = cluster_launch(x, y, z)?;
        if clustered {
            let mut value = sys::CUkernelNodeAttrValue { pad: [0; 64] };
            value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
            set_attribute(
                node,
                sys::CUkernelNodeAttrID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                &value,
            )?;
        }
        if clustered {
            let mut value = sys::CUkernelNodeAttrValue { pad: [0; 64] };
            value.clusterSchedulingPolicyPreference =
                scheduling_policy(kernel.cluster_scheduling_policy)?;
            set_attribute(
                node,
                sys::CUkernelNodeAttrID::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                &value,
            )?;
        }
        Ok(node)
    }

    fn add_memset(
        &mut self,
        memset: &MemsetNode,
        window: &Window,
    ) -> Result<sys::CUgraphNode, CudaError> {
        let extent = memset_extent(memset).map_err(|reason| CudaError::InvalidNode { reason })?;
        if !window.covers(memset.dst, extent) {
            return Err(CudaError::Unmapped {
                addr: memset.dst,
                len: extent,
            });
        }
        let params = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: memset.dst,
            pitch: to_usize(memset.pitch, "memset pitch")?,
            value: memset.value,
            elementSize: memset.element_size,
            width: to_usize(memset.width, "memset width")?,
            height: to_usize(memset.height, "memset height")?,
        };
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: `params` is a local describing mapped window memory
        // (checked above); the context is this graph's.
        check("cuGraphAddMemsetNode", unsafe {
            sys::cuGraphAddMemsetNode(
                &mut node,
                self.raw,
                ptr::null(),
                0,
                &params,
                self.context.raw(),
            )
        })?;
        Ok(node)
    }

    fn add_memcpy(
        &mut self,
        memcpy: &MemcpyNode,
        window: &Window,
    ) -> Result<sys::CUgraphNode, CudaError> {
        let len = memcpy.size_bytes;
        if len == 0 {
            return Err(CudaError::InvalidNode {
                reason: "memcpy of 0 bytes".to_owned(),
            });
        }
        for addr in [memcpy.src, memcpy.dst] {
            if !window.covers(addr, len) {
                return Err(CudaError::Unmapped { addr, len });
            }
        }
        let width = to_usize(len, "memcpy size")?;
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        // A 1-D device-to-device copy: one row of `width` bytes.
        let params = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: device,
            srcHost: ptr::null(),
            srcDevice: memcpy.src,
            srcArray: ptr::null_mut(),
            reserved0: ptr::null_mut(),
            srcPitch: width,
            srcHeight: 1,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: device,
            dstHost: ptr::null_mut(),
            dstDevice: memcpy.dst,
            dstArray: ptr::null_mut(),
            reserved1: ptr::null_mut(),
            dstPitch: width,
            dstHeight: 1,
            WidthInBytes: width,
            Height: 1,
            Depth: 1,
        };
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: `params` is a local describing mapped window memory
        // (checked above); the context is this graph's.
        check("cuGraphAddMemcpyNode", unsafe {
            sys::cuGraphAddMemcpyNode(
                &mut node,
                self.raw,
                ptr::null(),
                0,
                &params,
                self.context.raw(),
            )
        })?;
        Ok(node)
    }

    fn add_empty(&mut self) -> Result<sys::CUgraphNode, CudaError> {
        let mut node: sys::CUgraphNode = ptr::null_mut();
        // SAFETY: the out-pointer points to a local; no dependencies.
        check("cuGraphAddEmptyNode", unsafe {
            sys::cuGraphAddEmptyNode(&mut node, self.raw, ptr::null(), 0)
        })?;
        Ok(node)
    }

    fn add_edges(&mut self, edges: &[Edge], handles: &[sys::CUgraphNode]) -> Result<(), CudaError> {
        if edges.is_empty() {
            return Ok(());
        }
        let node = |edge: usize, end: u32| {
            usize::try_from(end)
                .ok()
                .and_then(|end| handles.get(end).copied())
                .ok_or(CudaError::InvalidEdge {
                    edge,
                    reason: "refers to a node past the graph",
                })
        };
        let mut from = Vec::with_capacity(edges.len());
        let mut to = Vec::with_capacity(edges.len());
        for (index, edge) in edges.iter().enumerate() {
            from.push(node(index, edge.from)?);
            to.push(node(index, edge.to)?);
        }
        // Plain dependencies pass no edge data (the driver then uses the
        // default: full ports, type 0).
        let data = edge_data(edges)?;
        let data_ptr = data.as_ref().map_or(ptr::null(), |data| data.as_ptr());
        // SAFETY: `from` and `to` hold `len` nodes of this graph; `data_ptr`
        // is null or points to `len` entries that outlive the call.
        check("cuGraphAddDependencies", unsafe {
            sys::cuGraphAddDependencies_v2(
                self.raw,
                from.as_ptr(),
                to.as_ptr(),
                data_ptr,
                from.len(),
            )
        })
    }

    /// Instantiates the graph for launching.
    pub fn instantiate(&self) -> Result<GraphExec, CudaError> {
        let mut raw: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: the out-pointer points to a local; the graph is complete.
        check("cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0)
        })?;
        Ok(GraphExec {
            context: Rc::clone(&self.context),
            raw,
        })
    }
}

fn set_attribute(
    node: sys::CUgraphNode,
    attribute: sys::CUkernelNodeAttrID,
    value: &sys::CUkernelNodeAttrValue,
) -> Result<(), CudaError> {
    // SAFETY: `node` is a kernel node of a live graph; `value` is a local
    // with the field for `attribute` set.
    check("cuGraphKernelNodeSetAttribute", unsafe {
        sys::cuGraphKernelNodeSetAttribute(node, attribute, value)
    })
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.context.bind();
        // SAFETY: the graph was created in `build` and is destroyed once.
        let _ = unsafe { sys::cuGraphDestroy(self.raw) };
    }
}

/// An instantiated graph. It uses the functions of the modules its graph was
/// built from: the owner destroys it before unloading them.
#[derive(Debug)]
pub struct GraphExec {
    context: Rc<Context>,
    raw: sys::CUgraphExec,
}

impl GraphExec {
    /// Uploads the executable graph's device resources ahead of its first
    /// launch.
    pub fn upload(&self, stream: &Stream) -> Result<(), CudaError> {
        // SAFETY: both handles are live objects of the same context.
        check("cuGraphUpload", unsafe {
            sys::cuGraphUpload(self.raw, stream.raw())
        })
    }

    /// Queues one replay on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<(), CudaError> {
        // SAFETY: both handles are live objects of the same context.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.raw, stream.raw())
        })
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let _ = self.context.bind();
        // SAFETY: the executable graph was instantiated in `instantiate`
        // and is destroyed once.
        let _ = unsafe { sys::cuGraphExecDestroy(self.raw) };
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_cluster_of_one_block_is_no_cluster() {
        assert!(!cluster_launch(0, 0, 0).unwrap());
        assert!(!cluster_launch(1, 1, 1).unwrap());
        assert!(cluster_launch(2, 1, 1).unwrap());
        assert!(matches!(
            cluster_launch(2, 0, 1),
            Err(CudaError::InvalidNode { .. })
        ));
    }

    use super::*;

    fn memset(element_size: u32, width: u64, height: u64, pitch: u64) -> MemsetNode {
        MemsetNode {
            dst: 0x1000,
            pitch,
            value: 0,
            element_size,
            width,
            height,
        }
    }

    #[test]
    fn a_flat_memset_touches_its_row() {
        assert_eq!(memset_extent(&memset(4, 10, 1, 0)), Ok(40));
    }

    #[test]
    fn a_pitched_memset_touches_every_row() {
        assert_eq!(memset_extent(&memset(2, 10, 3, 64)), Ok(2 * 64 + 20));
    }

    #[test]
    fn memsets_the_driver_cannot_do_are_refused() {
        assert!(memset_extent(&memset(8, 10, 1, 0)).is_err());
        assert!(memset_extent(&memset(1, 0, 1, 0)).is_err());
        assert!(memset_extent(&memset(1, 10, 0, 10)).is_err());
        assert!(memset_extent(&memset(4, 10, 2, 39)).is_err());
        assert!(memset_extent(&memset(4, u64::MAX, 1, 0)).is_err());
        assert!(memset_extent(&memset(1, 1, u64::MAX, u64::MAX)).is_err());
    }

    fn edge(from_port: u32, to_port: u32, kind: u32) -> Edge {
        Edge {
            from: 0,
            to: 1,
            from_port,
            to_port,
            r#type: kind,
        }
    }

    #[test]
    fn plain_edges_need_no_edge_data() {
        assert!(edge_data(&[edge(0, 0, 0), edge(0, 0, 0)])
            .unwrap()
            .is_none());
    }

    #[test]
    fn edge_data_keeps_ports_and_type() {
        let data = edge_data(&[edge(0, 0, 0), edge(1, 2, 3)]).unwrap().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(
            (data[0].from_port, data[0].to_port, data[0].type_),
            (0, 0, 0)
        );
        assert_eq!(
            (data[1].from_port, data[1].to_port, data[1].type_),
            (1, 2, 3)
        );
        assert_eq!(data[1].reserved, [0; 5]);
    }

    #[test]
    fn edge_data_that_does_not_fit_a_byte_is_refused() {
        let err = edge_data(&[edge(0, 0, 1), edge(256, 0, 0)]).unwrap_err();
        assert!(matches!(err, CudaError::InvalidEdge { edge: 1, .. }));
    }

    #[test]
    fn known_scheduling_policies_map_and_others_are_refused() {
        assert!(scheduling_policy(2).is_ok());
        assert!(matches!(
            scheduling_policy(7),
            Err(CudaError::InvalidNode { .. })
        ));
    }
}
