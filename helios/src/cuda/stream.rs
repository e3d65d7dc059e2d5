//! The stream graphs are launched on, and events that time work on it.

use std::ptr;
use std::rc::Rc;

use cudarc::driver::sys;

use super::context::Context;
use super::error::{check, CudaError};

/// A blocking stream: it is ordered with the legacy null stream, where the
/// window's synchronous host copies and zero fills run, so a launch always
/// sees the bytes written before it.
#[derive(Debug)]
pub struct Stream {
    context: Rc<Context>,
    raw: sys::CUstream,
}

impl Stream {
    /// Creates a stream in `context`.
    pub fn new(context: &Rc<Context>) -> Result<Self, CudaError> {
        let mut raw: sys::CUstream = ptr::null_mut();
        // SAFETY: the out-pointer points to a local; the context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_DEFAULT as u32)
        })?;
        Ok(Self {
            context: Rc::clone(context),
            raw,
        })
    }

    /// Waits until everything queued on the stream has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the stream was created in `new`.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.context.bind();
        let _ = self.synchronize();
        // SAFETY: the stream was created in `new` and is destroyed once.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// A timing event.
#[derive(Debug)]
pub struct Event {
    context: Rc<Context>,
    raw: sys::CUevent,
}

impl Event {
    /// Creates a timing event in `context`.
    pub fn new(context: &Rc<Context>) -> Result<Self, CudaError> {
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: the out-pointer points to a local; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })?;
        Ok(Self {
            context: Rc::clone(context),
            raw,
        })
    }

    /// Queues the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        // SAFETY: both handles are live objects of the same context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw())
        })
    }

    /// Waits until the event has completed.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the event was created in `new`.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }

    /// Milliseconds of device time from `self` to `end`, both recorded and
    /// completed.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        let mut ms = 0f32;
        // SAFETY: the out-pointer points to a local; both events are live.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.context.bind();
        // SAFETY: the event was created in `new` and is destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}
