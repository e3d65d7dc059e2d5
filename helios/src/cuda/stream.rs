//! The stream graphs are launched on, and events that time work on it.

use std::ptr;
use std::rc::Rc;

use cudarc::driver::sys;

use super::context::Context;
use super::error::{check, CudaError};
use super::pinned::PinnedBuffer;
use super::window::Window;

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

    /// Queues a copy of `len` bytes from `source[offset..]` to device
    /// address `addr`, ordered after everything queued before it. The
    /// source bytes must stay unchanged until the copy has run (an event
    /// recorded after it completed).
    pub fn copy_to_device(
        &self,
        window: &Window,
        addr: u64,
        source: &PinnedBuffer,
        offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        mapped(window, addr, len)?;
        let host = source.range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the destination lies in mapped window memory and the
        // source range in the pinned buffer (both checked above); the
        // caller keeps the source alive and unchanged until the copy ran.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(addr, host.cast_const().cast(), len, self.raw)
        })
    }

    /// Queues a copy of `len` bytes from device address `addr` into
    /// `target[offset..]`, ordered after everything queued before it. The
    /// target bytes may be read once an event recorded after it completed.
    pub fn copy_to_host(
        &self,
        window: &Window,
        target: &mut PinnedBuffer,
        offset: usize,
        addr: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        mapped(window, addr, len)?;
        let host = target.range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the source lies in mapped window memory and the target
        // range in the pinned buffer (both checked above).
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.cast(), addr, len, self.raw)
        })
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }
}

/// `Unmapped` unless `[addr, addr + len)` lies in `window`'s mapped memory.
fn mapped(window: &Window, addr: u64, len: usize) -> Result<(), CudaError> {
    let len = len as u64;
    if window.covers(addr, len) {
        Ok(())
    } else {
        Err(CudaError::Unmapped { addr, len })
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

/// An event: a timing event, or a completion marker without timing.
#[derive(Debug)]
pub struct Event {
    context: Rc<Context>,
    raw: sys::CUevent,
}

impl Event {
    /// Creates a timing event in `context`.
    pub fn new(context: &Rc<Context>) -> Result<Self, CudaError> {
        Self::with_flags(context, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
    }

    /// Creates an event that only marks completion (cheaper to record and
    /// query than a timing event).
    pub fn marker(context: &Rc<Context>) -> Result<Self, CudaError> {
        Self::with_flags(context, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    fn with_flags(context: &Rc<Context>, flags: u32) -> Result<Self, CudaError> {
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: the out-pointer points to a local; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Self {
            context: Rc::clone(context),
            raw,
        })
    }

    /// Whether the work before the event's last record has completed
    /// (true for an event never recorded).
    pub fn query(&self) -> Result<bool, CudaError> {
        // SAFETY: the event was created in `with_flags`.
        let result = unsafe { sys::cuEventQuery(self.raw) };
        if result == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", result).map(|()| true)
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
