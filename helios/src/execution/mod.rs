//! Execution over a core's graphs: the scheduler's launches packed into the
//! core's staging buffers ([`StagingLayout`]) and replayed on the GPU
//! ([`GpuExecutor`]), over a core Helios loaded or over graphs borrowed from
//! the process that prepared them ([`BorrowedGraphs`]). The executor reaches
//! the device only through [`LaunchDevice`], so it is tested on the CPU.

mod borrowed;
mod device;
mod gpu;
mod staging;

pub use borrowed::{BorrowError, BorrowedGraphs};
pub use device::{HostBuffer, LaunchDevice};
pub use gpu::{GpuExecutor, GraphTarget};
pub use staging::{Packed, StagingError, StagingLayout, View, Write};
