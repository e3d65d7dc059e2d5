//! What [`super::GpuExecutor`] does with the device, and nothing more: pinned
//! host buffers and completion markers allocated once, asynchronous copies
//! between them and the window, graph launches, and markers recorded,
//! queried and waited for — all on one stream, in the order they are issued.
//!
//! The executor's ring reuse, binding offsets and per-launch order run
//! against [`LaunchDevice`], so they are tested with a recording CPU fake
//! (`helios/tests/execution_gpu.rs`), as the replay check is through
//! [`crate::replay::ReplayDevice`]. Every [`GraphTarget`] (a core Helios
//! loaded, graphs borrowed in the preparing process) is a `LaunchDevice` over
//! the real CUDA types: [`PinnedBuffer`], [`Event`] and its [`Stream`].
//!
//! [`Stream`]: crate::cuda::Stream

use super::gpu::GraphTarget;
use crate::core::ValidCore;
use crate::cuda::{CudaError, Event, PinnedBuffer};

/// Host memory the device copies from and into. Its bytes may only be
/// touched once every copy queued on it is known to have run (a marker
/// recorded after the copy was seen complete).
pub trait HostBuffer {
    /// Its size in bytes.
    fn capacity(&self) -> usize;
    /// Overwrites its first `bytes.len()` bytes (at most [`Self::capacity`]).
    fn write(&mut self, bytes: &[u8]);
    /// Runs `read` over its bytes.
    fn read<R>(&self, read: impl FnOnce(&[u8]) -> R) -> R;
}

/// The device operations of the executor. Copies, launches and marker
/// records are queued on one stream and run in issue order.
pub trait LaunchDevice {
    /// Page-locked host memory.
    type Host: HostBuffer;
    /// A completion marker recorded on the stream.
    type Marker;

    /// The validated manifest whose contract the launches follow.
    fn core(&self) -> &ValidCore;
    /// The rank of [`Self::core`] whose window the launches use (0 for a
    /// one-rank core).
    fn rank(&self) -> u32 {
        0
    }
    /// Allocates `len` bytes of host memory for asynchronous copies.
    fn host_buffer(&mut self, len: usize) -> Result<Self::Host, CudaError>;
    /// Creates a completion marker.
    fn marker(&mut self) -> Result<Self::Marker, CudaError>;
    /// Queues a copy of `source[offset..offset + len]` to device address
    /// `addr`.
    fn copy_to_device(
        &mut self,
        addr: u64,
        source: &Self::Host,
        offset: usize,
        len: usize,
    ) -> Result<(), CudaError>;
    /// Queues one replay of the graph at manifest position `graph`.
    fn launch_graph(&mut self, graph: usize) -> Result<(), CudaError>;
    /// Queues a copy of `len` bytes at device address `addr` into
    /// `target[offset..offset + len]`.
    fn copy_to_host(
        &mut self,
        target: &mut Self::Host,
        offset: usize,
        addr: u64,
        len: usize,
    ) -> Result<(), CudaError>;
    /// Queues `marker`: it completes once everything queued before it ran.
    fn record(&mut self, marker: &Self::Marker) -> Result<(), CudaError>;
    /// Whether `marker`'s last record has completed.
    fn query(&mut self, marker: &Self::Marker) -> Result<bool, CudaError>;
    /// Waits until `marker`'s last record has completed.
    fn wait(&mut self, marker: &Self::Marker) -> Result<(), CudaError>;
}

impl HostBuffer for PinnedBuffer {
    fn capacity(&self) -> usize {
        self.len()
    }

    fn write(&mut self, bytes: &[u8]) {
        self.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    }

    fn read<R>(&self, read: impl FnOnce(&[u8]) -> R) -> R {
        read(self.as_slice())
    }
}

impl<T: GraphTarget> LaunchDevice for T {
    type Host = PinnedBuffer;
    type Marker = Event;

    fn core(&self) -> &ValidCore {
        GraphTarget::core(self)
    }

    fn rank(&self) -> u32 {
        GraphTarget::rank(self)
    }

    fn host_buffer(&mut self, len: usize) -> Result<PinnedBuffer, CudaError> {
        PinnedBuffer::new(self.context(), len)
    }

    fn marker(&mut self) -> Result<Event, CudaError> {
        Event::marker(self.context())
    }

    fn copy_to_device(
        &mut self,
        addr: u64,
        source: &PinnedBuffer,
        offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        (self.stream()).copy_to_device(self.window(), addr, source, offset, len)
    }

    fn launch_graph(&mut self, graph: usize) -> Result<(), CudaError> {
        GraphTarget::launch_graph(self, graph)
    }

    fn copy_to_host(
        &mut self,
        target: &mut PinnedBuffer,
        offset: usize,
        addr: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        (self.stream()).copy_to_host(self.window(), target, offset, addr, len)
    }

    fn record(&mut self, marker: &Event) -> Result<(), CudaError> {
        marker.record(self.stream())
    }

    fn query(&mut self, marker: &Event) -> Result<bool, CudaError> {
        marker.query()
    }

    fn wait(&mut self, marker: &Event) -> Result<(), CudaError> {
        marker.synchronize()
    }
}
