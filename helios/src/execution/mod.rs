//! Execution over a loaded core: the scheduler's launches packed into the
//! core's staging buffers ([`StagingLayout`]) and replayed on the GPU
//! ([`GpuExecutor`]).

mod gpu;
mod staging;

pub use gpu::GpuExecutor;
pub use staging::{Packed, StagingError, StagingLayout, View, Write};
