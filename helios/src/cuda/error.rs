//! Errors of the CUDA driver layer, and the one place a `CUresult` becomes one.

use std::ffi::{c_char, CStr};
use std::ptr;

use cudarc::driver::sys;

use super::params::ParamError;

/// What went wrong in the CUDA driver layer.
///
/// Driver failures keep the call, the numeric `CUresult` and the driver's name
/// for it; everything the layer refuses before calling the driver has its own
/// variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library could not be loaded.
    #[error(
        "the CUDA driver cannot be loaded: libcuda.so / libcuda.so.1 were not found \
         (no NVIDIA driver on this machine?)"
    )]
    DriverUnavailable,
    /// A driver call returned an error.
    #[error("{call} failed: {name} (CUresult {code})")]
    Driver {
        /// The driver entry point, for example `cuMemMap`.
        call: &'static str,
        /// The numeric `CUresult`.
        code: u32,
        /// The driver's name for it, for example `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
    },
    /// The window's address range could not be reserved at its recorded base:
    /// the driver placed the reservation elsewhere (the hint is only a hint),
    /// so something in this process already uses the range.
    #[error(
        "the window cannot be reserved at {base:#x}: the driver placed it at {got:#x} \
         (the address range is taken in this process)"
    )]
    WindowUnavailable {
        /// The base the core was exported with.
        base: u64,
        /// Where the driver put the reservation instead.
        got: u64,
    },
    /// A span to map is not aligned to the allocation granularity, overlaps a
    /// mapped span or lies outside the reservation.
    #[error("cannot map {len} bytes at window offset {offset:#x}: {reason}")]
    InvalidSpan {
        /// Offset of the span from the window base.
        offset: u64,
        /// Length of the span in bytes.
        len: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A range that must lie in the window's mapped memory does not (a host
    /// copy, a memset or memcpy node).
    #[error("{len} bytes at {addr:#x} are not inside the window's mapped memory")]
    Unmapped {
        /// First address of the range.
        addr: u64,
        /// Length of the range in bytes.
        len: u64,
    },
    /// A host range of a pinned buffer lies outside it.
    #[error("{len} bytes at offset {offset} do not fit a pinned buffer of {size} bytes")]
    HostRange {
        /// Offset into the buffer.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the buffer.
        size: usize,
    },
    /// A kernel node's parameter bytes disagree with its layout.
    #[error("kernel parameters: {0}")]
    Params(#[from] ParamError),
    /// A kernel node names an image that was not loaded.
    #[error("kernel image {sha256} is not loaded")]
    ImageNotLoaded {
        /// The image's digest.
        sha256: String,
    },
    /// A node cannot be added as described.
    #[error("{reason}")]
    InvalidNode {
        /// What is wrong with it.
        reason: String,
    },
    /// An edge cannot be added as described.
    #[error("edge {edge}: {reason}")]
    InvalidEdge {
        /// Position of the edge in the graph's edge list.
        edge: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another device's context is current on the calling thread, where
    /// device `ordinal`'s work must go.
    #[error(
        "another device's CUDA context is current on this thread, not device {ordinal}'s: \
         make device {ordinal} current first (torch.cuda.set_device({ordinal}))"
    )]
    OtherContextCurrent {
        /// The device the call was for.
        ordinal: i32,
    },
    /// Adding node `node` of a graph failed.
    #[error("node {node}: {source}")]
    AtNode {
        /// Position of the node in the graph's node list.
        node: usize,
        /// Why it failed.
        #[source]
        source: Box<CudaError>,
    },
}

impl CudaError {
    /// Attaches the position of the node being added.
    pub(crate) fn at_node(self, node: usize) -> Self {
        CudaError::AtNode {
            node,
            source: Box::new(self),
        }
    }
}

/// The driver's name for `result`, or its debug spelling when the driver
/// does not know it.
fn error_name(result: sys::CUresult) -> String {
    let mut name: *const c_char = ptr::null();
    // SAFETY: cuGetErrorName only writes a pointer to a static string into the
    // out-pointer, which points to a local.
    let found = unsafe { sys::cuGetErrorName(result, &mut name) };
    if found == sys::CUresult::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: the driver returned a non-null pointer to a NUL-terminated
        // string it owns for the life of the process.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{result:?}")
    }
}

/// `Ok` for `CUDA_SUCCESS`, otherwise [`CudaError::Driver`] naming `call`.
pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<(), CudaError> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            call,
            code: result as u32,
            name: error_name(result),
        })
    }
}
