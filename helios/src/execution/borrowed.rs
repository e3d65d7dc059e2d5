//! Graphs borrowed from the process that prepared them: the in-process
//! diagnostic path (Heliopause's `start_server`).
//!
//! Ignition prepared the model in this process inside the Heliopause window;
//! its PyTorch graphs are instantiated and their buffers mapped. A manifest
//! without graph nodes describes the contract, buffers, window and frontend,
//! and the graphs come as their executable handles, in manifest order. The
//! Python owner of all of it outlives this value (the caller's guarantee):
//! nothing here releases a graph, a buffer or the window.

use std::rc::Rc;

use cudarc::driver::sys;

use super::gpu::GraphTarget;
use crate::core::{decode_manifest, CoreError, ValidCore};
use crate::cuda::{Context, CudaError, Span, Stream, Window};

/// Why borrowed graphs cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BorrowError {
    /// The manifest does not decode or validate.
    #[error("invalid in-process manifest: {0}")]
    Core(#[from] CoreError),
    /// The handles do not match the manifest's graphs.
    #[error("{handles} graph handles for {graphs} graphs in the manifest")]
    HandleCount {
        /// Handles given.
        handles: usize,
        /// Graphs the manifest lists.
        graphs: usize,
    },
    /// A handle is null.
    #[error("the handle of graph {0} is null")]
    NullHandle(usize),
    /// The CUDA context, stream or window description failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// A prepared model's graphs and buffers, borrowed in the preparing process.
#[derive(Debug)]
pub struct BorrowedGraphs {
    execs: Vec<sys::CUgraphExec>,
    stream: Stream,
    window: Window,
    context: Rc<Context>,
    core: ValidCore,
}

impl BorrowedGraphs {
    /// Borrows `execs` (executable graph handles, in the manifest's graph
    /// order) on device `device`, whose primary context must be the one
    /// they were instantiated in. Each region's `backed_bytes` from its
    /// start are taken as mapped.
    ///
    /// # Safety
    ///
    /// Every handle must be a live `CUgraphExec` of that context, and the
    /// graphs, the buffers they address and the window must stay alive and
    /// unchanged (no re-instantiation) for the life of the returned value.
    pub unsafe fn new(manifest: &[u8], execs: &[u64], device: i32) -> Result<Self, BorrowError> {
        let core = decode_manifest(manifest)?;
        if execs.len() != core.graphs().len() {
            return Err(BorrowError::HandleCount {
                handles: execs.len(),
                graphs: core.graphs().len(),
            });
        }
        if let Some(index) = execs.iter().position(|&handle| handle == 0) {
            return Err(BorrowError::NullHandle(index));
        }
        let context = Context::new(device)?;
        let window = core.window();
        let spans = (window.regions.iter())
            .filter(|region| region.backed_bytes > 0)
            .map(|region| Span {
                offset: region.offset,
                len: region.backed_bytes,
            })
            .collect();
        let window = Window::borrowed(&context, window.base, window.size, spans)?;
        let stream = Stream::new(&context)?;
        Ok(Self {
            execs: execs.iter().map(|&h| h as sys::CUgraphExec).collect(),
            stream,
            window,
            context,
            core,
        })
    }
}

impl GraphTarget for BorrowedGraphs {
    fn core(&self) -> &ValidCore {
        &self.core
    }

    fn context(&self) -> &Rc<Context> {
        &self.context
    }

    fn stream(&self) -> &Stream {
        &self.stream
    }

    fn window(&self) -> &Window {
        &self.window
    }

    fn launch_graph(&self, index: usize) -> Result<(), CudaError> {
        let exec = *self.execs.get(index).ok_or(CudaError::InvalidNode {
            reason: format!("no graph at position {index}"),
        })?;
        // SAFETY: a live executable graph of this context (the constructor's
        // contract) on a stream of the same context.
        crate::cuda::check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(exec, self.stream.raw())
        })
    }
}

impl Drop for BorrowedGraphs {
    fn drop(&mut self) {
        // Work queued on the borrowed graphs finishes before the owner may
        // release them.
        let _ = self.context.bind();
        let _ = self.stream.synchronize();
    }
}
