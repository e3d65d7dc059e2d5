//! The driver, one device and its primary context, as Helios's own driver
//! objects use it.
//!
//! The driver is loaded at run time ([`PrimaryContext::retain`]), so Helios
//! builds and its CPU tests run on machines without CUDA; [`Context::new`]
//! then fails with [`CudaError::DriverUnavailable`].
//!
//! Helios uses the device's *primary* context, made current on the thread
//! that creates the [`Context`]. Every owner of a driver object holds an
//! `Rc<Context>`, so the context is released last, and none of them can
//! leave that thread (`Rc` and the raw handles are neither `Send` nor
//! `Sync`).

use std::ffi::{c_char, c_int, CStr};
use std::rc::Rc;

use cudarc::driver::sys;
use serde::Serialize;

use super::error::{check, CudaError};
use super::primary::PrimaryContext;

/// What the device is, as the core's identity records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// The device ordinal.
    pub ordinal: i32,
    /// The device's name, for example `NVIDIA H200`.
    pub name: String,
    /// Compute capability, major part.
    pub compute_capability_major: u32,
    /// Compute capability, minor part.
    pub compute_capability_minor: u32,
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// The driver's CUDA version, for example 13000.
    pub driver_version: u32,
    /// Device memory in bytes.
    pub total_memory: u64,
}

/// Free and total device memory, as `cuMemGetInfo` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryInfo {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// The retained primary context of one device, kept on the thread that
/// created it.
#[derive(Debug)]
pub struct Context {
    primary: PrimaryContext,
}

impl Context {
    /// Loads and initializes the driver, retains device `ordinal`'s primary
    /// context and makes it current on this thread.
    pub fn new(ordinal: i32) -> Result<Rc<Self>, CudaError> {
        // On failure below, dropping `primary` releases the retained context.
        let primary = PrimaryContext::retain(ordinal)?;
        primary.make_current()?;
        Ok(Rc::new(Context { primary }))
    }

    /// Makes this context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.primary.make_current()
    }

    /// Waits until all work queued in the context has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.primary.synchronize()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.primary.ordinal()
    }

    /// The retained primary context itself.
    pub fn primary(&self) -> &PrimaryContext {
        &self.primary
    }

    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.primary.raw()
    }

    fn device(&self) -> sys::CUdevice {
        self.primary.device()
    }

    fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<u32, CudaError> {
        let mut value: c_int = 0;
        // SAFETY: the out-pointer points to a local.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut value, attribute, self.device())
        })?;
        Ok(u32::try_from(value).unwrap_or(0))
    }

    /// Name, compute capability, SM count, driver version and memory of the
    /// device.
    pub fn info(&self) -> Result<DeviceInfo, CudaError> {
        use sys::CUdevice_attribute as A;
        let mut name = [0 as c_char; 256];
        // SAFETY: the driver writes at most `name.len()` bytes, NUL included.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, self.device())
        })?;
        // Never read past the array, even if the driver left no NUL.
        let last = name.len() - 1;
        name[last] = 0;
        // SAFETY: the array is NUL-terminated (set just above).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut driver_version: c_int = 0;
        // SAFETY: the out-pointer points to a local.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut driver_version)
        })?;
        let mut total_memory: usize = 0;
        // SAFETY: the out-pointer points to a local.
        check("cuDeviceTotalMem", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total_memory, self.device())
        })?;
        Ok(DeviceInfo {
            ordinal: self.ordinal(),
            name,
            compute_capability_major: self
                .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            compute_capability_minor: self
                .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            sm_count: self.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            driver_version: u32::try_from(driver_version).unwrap_or(0),
            total_memory: total_memory as u64,
        })
    }

    /// Whether device `peer` can read and write this context's device's
    /// memory (always for the same device): what granting `peer` access to
    /// memory mapped here needs.
    pub fn peer_can_access(&self, peer: i32) -> Result<bool, CudaError> {
        if peer == self.ordinal() {
            return Ok(true);
        }
        let mut device: sys::CUdevice = 0;
        // SAFETY: the out-pointer points to a local; the driver is loaded.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, peer)
        })?;
        let mut can: c_int = 0;
        // SAFETY: the out-pointer points to a local. The first device is the
        // one that would access the second's memory.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, device, self.device())
        })?;
        Ok(can != 0)
    }

    /// Free and total device memory.
    pub fn mem_get_info(&self) -> Result<MemoryInfo, CudaError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers point to locals; the context is current.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    /// The physical allocation granularity of pinned device memory on this
    /// device: every mapping's address and size is a multiple of it.
    pub fn granularity(&self) -> Result<u64, CudaError> {
        self.primary.granularity()
    }
}

impl Drop for Context {
    /// Drains the context and releases the primary context. Every other
    /// owner holds an `Rc<Context>`, so they are all gone by now.
    fn drop(&mut self) {
        let _ = self.bind();
        let _ = self.synchronize();
        let _ = self.primary.release();
    }
}
