//! The process-global window and its C ABI for PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator`.
//!
//! Python opens the window (`window_open`), selects a region and hands
//! `flare_window_alloc` / `flare_window_free` from this very library (see
//! `library_path()`) to PyTorch. PyTorch then calls them for every segment its
//! caching allocator needs in the `MemPool` using them; they serve the current
//! region of the one global window.
//!
//! Errors never cross the C boundary as panics: a failed allocation returns
//! null (PyTorch raises its out-of-memory error), a failed free is ignored by
//! PyTorch, and both record the error's message for `window_last_error()`.
//!
//! The caching allocator keeps freed segments cached *per pool* and reuses them
//! whatever the current region is; to keep regions apart, use one `MemPool`
//! per region (all over the same allocator) and select the region before
//! allocating in its pool.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::cuda_backing::CudaBacking;
use crate::window::{RegionUsage, Window, WindowError};

struct Global {
    window: Window<CudaBacking>,
    device: i32,
}

static WINDOW: Mutex<Option<Global>> = Mutex::new(None);
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);
static FAILURES: Mutex<u64> = Mutex::new(0);

/// Locks ignoring poison: every critical section leaves the data consistent
/// (the window mutates only after its checks pass), and a poisoned lock must
/// not turn into a panic on the C path.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn record(message: String) {
    *lock(&LAST_ERROR) = Some(message);
    *lock(&FAILURES) += 1;
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Runs `f`, turning a panic into an error message.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, WindowError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(payload) => Err(format!("{what}: panic: {}", panic_message(&*payload))),
    }
}

fn with_window<T>(f: impl FnOnce(&mut Global) -> Result<T, WindowError>) -> Result<T, WindowError> {
    match lock(&WINDOW).as_mut() {
        Some(g) => f(g),
        None => Err(WindowError::NotOpen),
    }
}

fn check_device(g: &Global, device: i32) -> Result<(), WindowError> {
    if device == g.device {
        Ok(())
    } else {
        Err(WindowError::WrongDevice {
            expected: g.device,
            got: device,
        })
    }
}

/// `CUDAPluggableAllocator` allocation entry point: `size` bytes in the
/// current region of the global window. Null on any failure (message in
/// `window_last_error()`).
#[no_mangle]
pub extern "C" fn flare_window_alloc(
    size: isize,
    device: i32,
    _stream: *mut c_void,
) -> *mut c_void {
    let result = guarded("flare_window_alloc", || {
        with_window(|g| {
            check_device(g, device)?;
            let size =
                u64::try_from(size).map_err(|_| WindowError::NegativeSize { size: size as i64 })?;
            g.window.alloc(size)
        })
    });
    match result {
        Ok(ptr) => ptr as usize as *mut c_void,
        Err(message) => {
            record(format!("{message} (size {size}, device {device})"));
            ptr::null_mut()
        }
    }
}

/// `CUDAPluggableAllocator` free entry point: gives a block back to its
/// region's free list. Failures (unknown pointer, size mismatch, no window)
/// are recorded, never raised.
#[no_mangle]
pub extern "C" fn flare_window_free(
    ptr: *mut c_void,
    size: isize,
    device: i32,
    _stream: *mut c_void,
) {
    let addr = ptr as usize as u64;
    let result = guarded("flare_window_free", || {
        with_window(|g| {
            check_device(g, device)?;
            let size =
                u64::try_from(size).map_err(|_| WindowError::NegativeSize { size: size as i64 })?;
            g.window.free(addr, size)
        })
    });
    if let Err(message) = result {
        record(format!("{message} (device {device})"));
    }
}

/// Opens the global window on `device`: validates the request, loads the
/// driver, reserves `[base, base + size)` at exactly `base` and lays the
/// regions out. Clears the last recorded error.
pub fn open(base: u64, size: u64, regions: &[(String, u64)], device: i32) -> Result<(), String> {
    guarded("window_open", || {
        let mut slot = lock(&WINDOW);
        if let Some(g) = slot.as_ref() {
            return Err(WindowError::AlreadyOpen {
                base: g.window.base(),
            });
        }
        Window::<CudaBacking>::check_request(base, size, regions)?;
        let backing = CudaBacking::new(device)?;
        let window = Window::open(backing, base, size, regions)?;
        *slot = Some(Global { window, device });
        *lock(&LAST_ERROR) = None;
        Ok(())
    })
}

/// Selects the region subsequent allocations come from.
pub fn select(name: &str) -> Result<(), String> {
    guarded("window_select", || with_window(|g| g.window.select(name)))
}

/// Maps region `name` of the global window whole with memory another process
/// may map (`Window::export_region`): its address, size and descriptor.
pub fn export_region(name: &str) -> Result<(u64, u64, std::os::fd::OwnedFd), String> {
    guarded("window_export_region", || {
        with_window(|g| g.window.export_region(name))
    })
}

/// Per-region usage of the global window.
pub fn usage() -> Result<Vec<RegionUsage>, String> {
    guarded("window_usage", || with_window(|g| Ok(g.window.usage())))
}

/// Window-wide facts, or `None` when no window is open.
pub struct Info {
    pub base: u64,
    pub size: u64,
    pub granularity: u64,
    pub device: i32,
    pub current: Option<String>,
    pub live_blocks: u64,
    pub live_bytes: u64,
}

pub fn info() -> Option<Info> {
    lock(&WINDOW).as_ref().map(|g| {
        let (live_blocks, live_bytes) = g.window.live();
        Info {
            base: g.window.base(),
            size: g.window.size(),
            granularity: g.window.granularity(),
            device: g.device,
            current: g.window.current().map(str::to_owned),
            live_blocks,
            live_bytes,
        }
    })
}

/// Most recent error of the C entry points, optionally clearing it.
pub fn last_error(clear: bool) -> Option<String> {
    let mut slot = lock(&LAST_ERROR);
    if clear {
        slot.take()
    } else {
        slot.clone()
    }
}

/// Number of failed C entry point calls since the module was loaded.
pub fn failures() -> u64 {
    *lock(&FAILURES)
}

/// Closes the global window: refused while blocks are live (PyTorch still
/// holds segments: drop the tensors, graphs and pools, then
/// `torch.cuda.empty_cache()`); otherwise unmaps everything and frees the
/// reservation. If releasing fails, the window stays open so close can be
/// retried.
pub fn close() -> Result<(), String> {
    guarded("window_close", || {
        let mut slot = lock(&WINDOW);
        let g = slot.take().ok_or(WindowError::NotOpen)?;
        match g.window.close() {
            Ok(_backing) => Ok(()),
            Err(failed) => {
                let (window, e) = *failed;
                *slot = Some(Global {
                    window,
                    device: g.device,
                });
                Err(e)
            }
        }
    })
}

/// Filesystem path of the loaded library that exports the C entry points.
pub fn library_path() -> Result<String, String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let symbol = flare_window_alloc as *const c_void;
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let found = unsafe { libc::dladdr(symbol, info.as_mut_ptr()) };
    // SAFETY: zero-initialized, and filled in by dladdr when it succeeds.
    let info = unsafe { info.assume_init() };
    if found == 0 || info.dli_fname.is_null() {
        return Err("dladdr could not find the library containing flare_window_alloc".into());
    }
    // SAFETY: the loader's NUL-terminated path of the object, alive while loaded.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = path
        .to_str()
        .map_err(|e| format!("library path is not UTF-8: {e}"))?;
    // The loader's own name for it (what Python passed to dlopen), made
    // absolute only if it is not already, so `ctypes.CDLL` finds this very copy.
    if std::path::Path::new(path).is_absolute() {
        return Ok(path.to_owned());
    }
    std::fs::canonicalize(path)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("cannot resolve library path {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without an open window the C entry points fail cleanly and record why.
    /// (The only test touching the globals, so no ordering issues.)
    #[test]
    fn c_entry_points_without_a_window() {
        assert!(info().is_none());
        let before = failures();
        let p = flare_window_alloc(4096, 0, ptr::null_mut());
        assert!(p.is_null());
        let msg = last_error(false).expect("recorded");
        assert!(msg.contains("no window is open"), "{msg}");
        assert!(msg.contains("size 4096"), "{msg}");
        flare_window_free(0x1234 as *mut c_void, 16, 0, ptr::null_mut());
        assert!(last_error(true).unwrap().contains("flare_window_free"));
        assert_eq!(last_error(false), None);
        assert_eq!(failures(), before + 2);
        assert!(select("weights").unwrap_err().contains("no window is open"));
        assert!(close().unwrap_err().contains("no window is open"));
        assert!(open(0x2000_0000_0000, 1 << 20, &[("a".into(), 1)], 0)
            .unwrap_err()
            .contains("32 MiB"));
    }

    #[test]
    fn library_path_names_an_existing_file() {
        let path = library_path().unwrap();
        assert!(std::path::Path::new(&path).is_file(), "{path}");
    }
}
