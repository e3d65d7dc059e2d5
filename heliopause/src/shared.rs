//! `SharedSpan`: device memory at a fixed address that the rank processes of a
//! tensor-parallel group map into each other's address space, for the
//! collectives' storage (`ignition.parallel.window_collectives`).
//!
//! The owner reserves the range at its recorded address, maps fresh zeroed
//! memory there and exports it as a POSIX file descriptor; a peer process
//! receives the descriptor (`ignition.parallel.handles`), reserves the same
//! address in its own space and maps the owner's memory there, with access for
//! its own device. A kernel captured in either process then names the same
//! address for the same bytes, as it will in Helios's one serving process.
//!
//! The driver calls are Helios's ([`Reservation::map_exported`],
//! [`Reservation::map_imported`]); the primary context is retained as the
//! window's backing retains it.

use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd};
use std::sync::Mutex;

use helios::cuda::{CudaError, PrimaryContext, Reservation};
use pyo3::prelude::*;

use crate::window::{WindowError, MIN_WINDOW_SIZE};
use crate::window_err;

/// One span's driver state: dropped (reservation first) when closed.
struct Held {
    reservation: Reservation,
    context: PrimaryContext,
}

/// Reserves at least `size` bytes at exactly `address` on device `ordinal`
/// (the driver honours an address only for a reservation of
/// [`MIN_WINDOW_SIZE`] or more, so a smaller span reserves that much and maps
/// its own size), or fails (a misplaced reservation is released). Another
/// device's context current on the thread is refused.
fn reserve(ordinal: i32, address: u64, size: u64) -> Result<Held, WindowError> {
    let context = PrimaryContext::retain(ordinal)?;
    context.make_current_unless_other()?;
    let granularity = context.granularity()?;
    if size == 0 || !size.is_multiple_of(granularity) || !address.is_multiple_of(granularity) {
        return Err(WindowError::Layout(format!(
            "a shared span's address {address:#x} and size {size} must be nonzero multiples of \
             the allocation granularity ({granularity} bytes)"
        )));
    }
    let reserved = size.max(MIN_WINDOW_SIZE).div_ceil(granularity) * granularity;
    let mut reservation = Reservation::reserve(&context, address, reserved)?;
    if reservation.base() != address {
        let got = reservation.base();
        reservation.release()?;
        return Err(WindowError::HintMismatch { hint: address, got });
    }
    Ok(Held {
        reservation,
        context,
    })
}

/// Device memory shared between processes at a fixed address: `export`
/// makes it, `import_` maps another process's. `address`, `size`, `fd`
/// (the exported descriptor, until taken), `close()`.
#[pyclass(module = "flare_heliopause")]
pub struct SharedSpan {
    address: u64,
    size: u64,
    held: Mutex<Option<Held>>,
    fd: Mutex<Option<OwnedFd>>,
}

impl SharedSpan {
    fn new(address: u64, size: u64, held: Held, fd: Option<OwnedFd>) -> Self {
        Self {
            address,
            size,
            held: Mutex::new(Some(held)),
            fd: Mutex::new(fd),
        }
    }
}

#[pymethods]
impl SharedSpan {
    /// Reserves `size` bytes at exactly `address` on CUDA device `device`,
    /// maps zeroed memory there that other processes may map, and keeps its
    /// descriptor for `take_fd()`. Raises `WindowError` when the address is
    /// taken, the sizes are not granule multiples, or a driver call fails.
    #[staticmethod]
    #[pyo3(signature = (address, size, device = 0))]
    fn export(py: Python<'_>, address: u64, size: u64, device: i32) -> PyResult<Self> {
        py.detach(|| {
            let mut held = reserve(device, address, size)?;
            let fd = held.reservation.map_exported(address, size)?;
            Ok::<_, WindowError>(Self::new(address, size, held, Some(fd)))
        })
        .map_err(|e| window_err(e.to_string()))
    }

    /// Reserves `size` bytes at exactly `address` on CUDA device `device` and
    /// maps there the memory another process exported as descriptor `fd`
    /// (received into this process; it stays the caller's to close), with
    /// read and write access for `device`.
    #[staticmethod]
    #[pyo3(name = "import_", signature = (address, size, fd, device = 0))]
    fn import(py: Python<'_>, address: u64, size: u64, fd: i32, device: i32) -> PyResult<Self> {
        if fd < 0 {
            return Err(window_err(format!("{fd} is not a file descriptor")));
        }
        py.detach(|| {
            let mut held = reserve(device, address, size)?;
            // SAFETY: the caller passes an open descriptor it keeps open for
            // this call; it is only borrowed.
            let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
            held.reservation.map_imported(address, size, borrowed)?;
            Ok::<_, WindowError>(Self::new(address, size, held, None))
        })
        .map_err(|e| window_err(e.to_string()))
    }

    /// The span's device address.
    #[getter]
    fn address(&self) -> u64 {
        self.address
    }

    /// The span's size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The exported descriptor, now the caller's to close (`os.close`); None
    /// for an imported span or once taken.
    fn take_fd(&self) -> Option<i32> {
        let mut fd = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        fd.take().map(IntoRawFd::into_raw_fd)
    }

    /// Waits for the device's work, unmaps the span and frees the address.
    /// Idempotent. Memory another process imported stays alive there.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.fd.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(Held {
            mut reservation,
            mut context,
        }) = held
        else {
            return Ok(());
        };
        py.detach(|| -> Result<(), CudaError> {
            context.make_current_unless_other()?;
            reservation.release()?;
            drop(reservation);
            context.release()
        })
        .map_err(|e| window_err(WindowError::from(e).to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (or a device 0) no span is reserved: Helios's typed
    /// error, before any address is touched.
    #[test]
    fn a_span_without_a_driver_is_a_typed_error() {
        match reserve(0, 0x3000_0000_0000, 2 << 20) {
            Err(WindowError::Cuda(CudaError::DriverUnavailable | CudaError::Driver { .. })) => {}
            Err(other) => panic!("unexpected error: {other}"),
            // A machine with a GPU: the span is there, at the address asked.
            Ok(held) => assert_eq!(held.reservation.base(), 0x3000_0000_0000),
        }
    }
}
