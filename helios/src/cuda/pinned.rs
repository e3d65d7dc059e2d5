//! Page-locked host memory: the source and destination of asynchronous
//! copies, allocated once at startup (serving allocates nothing).

use std::ffi::c_void;
use std::ptr;
use std::rc::Rc;

use cudarc::driver::sys;

use super::context::Context;
use super::error::{check, CudaError};

/// A page-locked host buffer of fixed length, zeroed at allocation.
#[derive(Debug)]
pub struct PinnedBuffer {
    context: Rc<Context>,
    raw: *mut u8,
    len: usize,
}

impl PinnedBuffer {
    /// Allocates `len` bytes (at least one) of page-locked host memory.
    pub fn new(context: &Rc<Context>, len: usize) -> Result<Self, CudaError> {
        let len = len.max(1);
        let mut raw: *mut c_void = ptr::null_mut();
        context.bind()?;
        // SAFETY: the out-pointer points to a local; the context is current.
        check("cuMemAllocHost", unsafe {
            sys::cuMemAllocHost_v2(&mut raw, len)
        })?;
        // SAFETY: the driver returned `len` writable bytes at `raw`.
        unsafe { ptr::write_bytes(raw.cast::<u8>(), 0, len) };
        Ok(Self {
            context: Rc::clone(context),
            raw: raw.cast(),
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: allocations hold at least a byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. The caller must not read bytes an asynchronous copy into
    /// this buffer may still be writing (wait for its event first).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `raw` holds `len` initialized bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.raw, self.len) }
    }

    /// The bytes, writable. The caller must not change bytes an
    /// asynchronous copy out of this buffer may still be reading.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `raw` holds `len` initialized bytes owned by `self`, and
        // `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.raw, self.len) }
    }

    /// Host address of byte `offset`, checked to leave `len` bytes.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<*mut u8, CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `offset` is within the allocation (checked).
                Ok(unsafe { self.raw.add(offset) })
            }
            _ => Err(CudaError::HostRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.context.bind();
        // Copies may still use the memory: wait for all work first.
        let _ = self.context.synchronize();
        // SAFETY: allocated in `new` and freed once.
        let _ = unsafe { sys::cuMemFreeHost(self.raw.cast()) };
    }
}
