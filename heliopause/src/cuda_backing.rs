//! [`Backing`] over the CUDA driver's virtual memory API.
//!
//! The driver (`libcuda.so`) is loaded at run time through cudarc's
//! `dynamic-loading` raw bindings, so this builds and imports on machines
//! without CUDA; [`CudaBacking::new`] then fails with
//! [`WindowError::DriverUnavailable`]. Every `CUresult` is checked and turned
//! into [`WindowError::Backing`] with the driver's error name.
//!
//! Contexts: the backing retains the device's *primary* context (the one the
//! CUDA runtime, and so PyTorch, uses) and makes it current only on threads
//! that have no current context; it never creates a context of its own.
//!
//! Memory: each [`Backing::map`] creates one pinned device allocation of
//! exactly the requested size (a whole number of granules), maps it at the
//! requested address, drops the allocation handle (the mapping keeps the memory
//! alive) and grants the device read/write access. [`Backing::release`]
//! synchronizes the context, unmaps every span, frees the reservation and
//! releases the primary context.

use std::ffi::CStr;
use std::ptr;

use cudarc::driver::sys;

use crate::window::{Backing, WindowError};

/// CUDA physical memory behind a [`crate::window::Window`], on one device.
#[derive(Debug)]
pub struct CudaBacking {
    ordinal: i32,
    device: sys::CUdevice,
    /// The retained primary context; null once released.
    ctx: sys::CUcontext,
    granularity: u64,
    reservation: Option<(u64, u64)>,
    mapped: Vec<(u64, u64)>,
}

// SAFETY: a CUcontext handle is a process-wide driver object usable from any
// thread (that is what cuCtxSetCurrent is for); the backing is only ever used
// behind a mutex, never concurrently.
unsafe impl Send for CudaBacking {}

fn error_name(r: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string.
    let ok = unsafe { sys::cuGetErrorName(r, &mut name) };
    if ok == sys::CUresult::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: non-null, NUL-terminated, static lifetime (driver-owned).
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{r:?}")
    }
}

fn check(op: &'static str, r: sys::CUresult) -> Result<(), WindowError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(WindowError::Backing {
            op,
            code: r as u32,
            name: error_name(r),
        })
    }
}

impl CudaBacking {
    /// Loads the driver, initializes it, retains device `ordinal`'s primary
    /// context (making it current on this thread if none is) and queries the
    /// allocation granularity.
    pub fn new(ordinal: i32) -> Result<Self, WindowError> {
        // SAFETY: only tries to dlopen the driver library candidates.
        if !unsafe { sys::is_culib_present() } {
            return Err(WindowError::DriverUnavailable(
                "libcuda.so / libcuda.so.1 could not be loaded (no NVIDIA driver on this machine?)"
                    .into(),
            ));
        }
        // SAFETY (all driver calls below): plain driver entry points given valid
        // out-pointers to locals.
        check("cuInit", unsafe { sys::cuInit(0) })?;
        let mut device: sys::CUdevice = 0;
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut device, ordinal)
        })?;
        let mut ctx: sys::CUcontext = ptr::null_mut();
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, device)
        })?;
        // From here on, Drop releases the retained context on failure.
        let mut backing = CudaBacking {
            ordinal,
            device,
            ctx,
            granularity: 0,
            reservation: None,
            mapped: Vec::new(),
        };
        backing.ensure_current()?;
        let prop = backing.prop();
        let mut granularity: usize = 0;
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        backing.granularity = granularity as u64;
        Ok(backing)
    }

    /// The device ordinal this backing allocates on.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes the primary context current on the calling thread if the thread
    /// has no current context (PyTorch may call the allocator from any thread;
    /// the one it uses normally already has the primary context current).
    fn ensure_current(&self) -> Result<(), WindowError> {
        let mut current: sys::CUcontext = ptr::null_mut();
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current.is_null() {
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
        }
        Ok(())
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
        }
    }

    fn prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: self.location(),
            win32HandleMetaData: ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }
}

impl Backing for CudaBacking {
    fn granularity(&self) -> Result<u64, WindowError> {
        Ok(self.granularity)
    }

    fn reserve(&mut self, hint: u64, size: u64) -> Result<u64, WindowError> {
        if let Some((base, _)) = self.reservation {
            return Err(WindowError::AlreadyOpen { base });
        }
        self.ensure_current()?;
        let mut got: sys::CUdeviceptr = 0;
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut got, size as usize, 0, hint, 0)
        })?;
        // Kept even when it is not at the hint, so release() frees it.
        self.reservation = Some((got, size));
        Ok(got)
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), WindowError> {
        self.ensure_current()?;
        let len = size as usize;
        let prop = self.prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, len, &prop, 0)
        })?;
        let mapped = unsafe { sys::cuMemMap(addr, len, 0, handle, 0) };
        // The mapping holds its own reference; drop ours either way.
        let released = unsafe { sys::cuMemRelease(handle) };
        check("cuMemMap", mapped)?;
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let result = check("cuMemRelease", released).and_then(|()| {
            check("cuMemSetAccess", unsafe {
                sys::cuMemSetAccess(addr, len, &access, 1)
            })
        });
        if result.is_err() {
            // Best effort: the original error is the one to report.
            let _ = unsafe { sys::cuMemUnmap(addr, len) };
            return result;
        }
        self.mapped.push((addr, size));
        Ok(())
    }

    fn release(&mut self) -> Result<(), WindowError> {
        if !self.mapped.is_empty() || self.reservation.is_some() {
            self.ensure_current()?;
            // Nothing may still be running on memory about to be unmapped.
            check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        }
        while let Some(&(addr, size)) = self.mapped.last() {
            check("cuMemUnmap", unsafe {
                sys::cuMemUnmap(addr, size as usize)
            })?;
            self.mapped.pop();
        }
        if let Some((base, size)) = self.reservation {
            check("cuMemAddressFree", unsafe {
                sys::cuMemAddressFree(base, size as usize)
            })?;
            self.reservation = None;
        }
        if !self.ctx.is_null() {
            check("cuDevicePrimaryCtxRelease", unsafe {
                sys::cuDevicePrimaryCtxRelease_v2(self.device)
            })?;
            self.ctx = ptr::null_mut();
        }
        Ok(())
    }
}

impl Drop for CudaBacking {
    /// Frees whatever is still held (a failed open; a closed window has
    /// released everything already). Never reached for the process-global
    /// window, which lives until exit unless closed.
    fn drop(&mut self) {
        let _ = self.release();
    }
}
