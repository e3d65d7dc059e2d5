//! A small CUDA driver layer: what rebuilding and replaying a runtime core
//! needs, and nothing more.
//!
//! - [`PrimaryContext`]: the driver, loaded at run time, and a device's
//!   retained primary context (movable between threads; Heliopause's
//!   preparation window uses it directly).
//! - [`Context`]: that context on Helios's one thread; device facts and free
//!   memory.
//! - [`Reservation`]: the virtual memory sequence (reserve, map with access,
//!   unmap, free), shared by Helios's window and Heliopause's.
//! - [`Window`]: the fixed virtual-address window, reserved at its exact base
//!   and backed span by span; synchronous host copies into and out of it.
//! - [`Modules`]: kernel images loaded by digest; functions and their
//!   attributes.
//! - [`Graph`] and [`GraphExec`]: a manifest graph rebuilt node by node with
//!   its edges, instantiated and launched.
//! - [`Stream`] and [`Event`]: where graphs and asynchronous copies run, and
//!   how their completion and time are observed.
//! - [`PinnedBuffer`]: page-locked host memory for asynchronous copies.
//!
//! Every driver object Helios creates has one RAII owner holding an
//! `Rc<Context>`, so the context is released last. The owner of several
//! (Helios's loaded core) declares them in release order: executable graphs,
//! graphs and modules before the window, all after the work drained. All of
//! it stays on the thread that created the context. [`PrimaryContext`] and
//! [`Reservation`] hold no `Rc`: an owner elsewhere (Heliopause's allocator,
//! called on any thread behind a mutex) keeps them and makes the context
//! current itself.

mod context;
mod error;
mod graph;
mod module;
mod params;
mod pinned;
mod primary;
mod stream;
mod vmm;
mod window;

pub use context::{Context, DeviceInfo, MemoryInfo};
pub(crate) use error::check;
pub use error::CudaError;
pub use graph::{cluster_launch, edge_data, memset_extent, Graph, GraphExec};
pub use module::{Function, Module, Modules};
pub use params::{extra_words, param_ranges, KernelArgs, ParamError};
pub use pinned::PinnedBuffer;
pub use primary::PrimaryContext;
pub use stream::{Event, Stream};
pub use vmm::Reservation;
pub use window::{covered, Span, Window};
