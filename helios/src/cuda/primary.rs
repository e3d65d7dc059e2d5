//! A device's retained primary context: the one context Helios and
//! Heliopause ever use.
//!
//! Rules enforced here:
//! - the driver (`libcuda.so`) is loaded at run time through cudarc's
//!   `dynamic-loading` bindings, so everything builds and the CPU tests run
//!   on machines without CUDA; [`PrimaryContext::retain`] then fails with
//!   [`CudaError::DriverUnavailable`];
//! - no context is ever created: the device's *primary* context (the one the
//!   CUDA runtime, and so PyTorch, uses) is retained, and each retain is
//!   released exactly once ([`PrimaryContext::release`], or on drop);
//! - making it current is per thread and always explicit:
//!   [`PrimaryContext::make_current`] binds it unconditionally (Helios's
//!   model thread), [`PrimaryContext::make_current_if_none`] only where the
//!   thread has no current context (Heliopause's allocator, called by
//!   PyTorch on whatever thread it runs).
//!
//! The handle is a process-wide driver object, so a `PrimaryContext` may
//! move between threads ([`Send`]); Helios's [`super::Context`] wraps it in
//! an `Rc` to keep its own objects on one thread.

use std::ptr;

use cudarc::driver::sys;

use super::error::{check, CudaError};
use super::vmm;

/// A retained primary context of one device.
#[derive(Debug)]
pub struct PrimaryContext {
    ordinal: i32,
    device: sys::CUdevice,
    /// The retained context; null once released.
    raw: sys::CUcontext,
}

// SAFETY: a primary context handle is a process-wide driver object, usable
// from any thread (that is what cuCtxSetCurrent is for); retaining and
// releasing it are thread-safe driver calls. Nothing here is `Sync`: callers
// that share one serialize their use (Heliopause keeps it behind a mutex).
unsafe impl Send for PrimaryContext {}

/// The calling thread's current context (null: none).
fn current() -> Result<sys::CUcontext, CudaError> {
    let mut current: sys::CUcontext = ptr::null_mut();
    // SAFETY: the out-pointer points to a local.
    check("cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(&mut current)
    })?;
    Ok(current)
}

impl PrimaryContext {
    /// Loads and initializes the driver and retains device `ordinal`'s
    /// primary context. It is not made current.
    pub fn retain(ordinal: i32) -> Result<Self, CudaError> {
        // SAFETY: only tries to dlopen the driver library's candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::DriverUnavailable);
        }
        // SAFETY: plain driver entry point, no pointers.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: the out-pointer points to a local.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, ordinal)
        })?;
        let mut raw: sys::CUcontext = ptr::null_mut();
        // SAFETY: the out-pointer points to a local.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, device)
        })?;
        Ok(Self {
            ordinal,
            device,
            raw,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.raw
    }

    /// Makes this context current on the calling thread.
    pub fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: the handle is a retained primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.raw) })
    }

    /// Makes this context current on the calling thread only if the thread
    /// has no current context (a thread of the CUDA runtime normally has the
    /// primary context current already).
    pub fn make_current_if_none(&self) -> Result<(), CudaError> {
        if current()?.is_null() {
            self.make_current()?;
        }
        Ok(())
    }

    /// Makes this context current if the thread has none; fails with
    /// [`CudaError::OtherContextCurrent`] when another context is current
    /// (work and memory meant for this device would go to that one).
    pub fn make_current_unless_other(&self) -> Result<(), CudaError> {
        let current = current()?;
        if current.is_null() {
            return self.make_current();
        }
        if current != self.raw {
            return Err(CudaError::OtherContextCurrent {
                ordinal: self.ordinal,
            });
        }
        Ok(())
    }

    /// Waits until all work queued in the calling thread's current context
    /// has finished (make this one current first).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: plain driver entry point.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// The physical allocation granularity of pinned device memory on this
    /// device: every mapping's address and size is a multiple of it.
    pub fn granularity(&self) -> Result<u64, CudaError> {
        let prop = vmm::allocation_prop(self.ordinal);
        let mut granularity: usize = 0;
        // SAFETY: `prop` and the out-pointer point to locals.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(granularity as u64)
    }

    /// Releases the retained context. A no-op once released; on failure it
    /// stays retained, so release can be retried.
    pub fn release(&mut self) -> Result<(), CudaError> {
        if self.raw.is_null() {
            return Ok(());
        }
        // SAFETY: releases the reference retained in `retain`, exactly once
        // (the handle is cleared only after the release succeeded).
        check("cuDevicePrimaryCtxRelease", unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.device)
        })?;
        self.raw = ptr::null_mut();
        Ok(())
    }
}

impl Drop for PrimaryContext {
    /// Releases the context if that has not been done yet.
    fn drop(&mut self) {
        let _ = self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver, retaining fails with the typed error (and with one,
    /// a retained context releases exactly once).
    #[test]
    fn retain_needs_the_driver_and_release_is_idempotent() {
        match PrimaryContext::retain(0) {
            Err(CudaError::DriverUnavailable) => {}
            Err(CudaError::Driver { .. }) => {} // a driver without a usable device
            Err(other) => panic!("unexpected error: {other}"),
            Ok(mut context) => {
                context.release().unwrap();
                context.release().unwrap();
            }
        }
    }
}
