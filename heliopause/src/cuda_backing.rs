//! [`Backing`] over Helios's CUDA layer.
//!
//! The driver calls are Helios's: [`PrimaryContext`] loads the driver at run
//! time (so this builds and imports on machines without CUDA;
//! [`CudaBacking::new`] then fails with
//! [`helios::cuda::CudaError::DriverUnavailable`]), [`Reservation`] is the
//! virtual memory sequence and [`helios::cuda::CudaError`] names every failed
//! driver call. This file only decides when they run.
//!
//! Contexts: the backing retains the device's *primary* context (the one the
//! CUDA runtime, and so PyTorch, uses) and makes it current only on threads
//! that have no current context; it never creates a context of its own.
//!
//! Memory: each [`Backing::map`] maps one pinned device allocation of
//! exactly the requested size (a whole number of granules) at the requested
//! address with device read/write access, not zeroed.
//! [`Backing::release`] synchronizes the context, unmaps every span, frees
//! the reservation and releases the primary context.

use std::os::fd::OwnedFd;

use helios::cuda::{PrimaryContext, Reservation};

use crate::window::{Backing, WindowError};

/// CUDA physical memory behind a [`crate::window::Window`], on one device.
#[derive(Debug)]
pub struct CudaBacking {
    /// Declared before the context: released first.
    reservation: Option<Reservation>,
    context: PrimaryContext,
    granularity: u64,
}

impl CudaBacking {
    /// Loads the driver, initializes it, retains device `ordinal`'s primary
    /// context (making it current on this thread if none is) and queries the
    /// allocation granularity.
    pub fn new(ordinal: i32) -> Result<Self, WindowError> {
        // On failure below, dropping the context releases it.
        let context = PrimaryContext::retain(ordinal)?;
        context.make_current_if_none()?;
        let granularity = context.granularity()?;
        Ok(Self {
            reservation: None,
            context,
            granularity,
        })
    }

    /// The device ordinal this backing allocates on.
    pub fn ordinal(&self) -> i32 {
        self.context.ordinal()
    }
}

impl Backing for CudaBacking {
    fn granularity(&self) -> Result<u64, WindowError> {
        Ok(self.granularity)
    }

    fn reserve(&mut self, hint: u64, size: u64) -> Result<u64, WindowError> {
        if let Some(reservation) = &self.reservation {
            return Err(WindowError::AlreadyOpen {
                base: reservation.base(),
            });
        }
        self.context.make_current_if_none()?;
        let reservation = Reservation::reserve(&self.context, hint, size)?;
        let base = reservation.base();
        // Kept even when it is not at the hint, so release() frees it.
        self.reservation = Some(reservation);
        Ok(base)
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<(), WindowError> {
        let reservation = self.reservation.as_mut().ok_or(WindowError::NotOpen)?;
        // PyTorch may call the allocator from any thread; the one it uses
        // normally already has the primary context current.
        self.context.make_current_if_none()?;
        reservation.map(addr, size)?;
        Ok(())
    }

    fn map_exported(&mut self, addr: u64, size: u64) -> Result<OwnedFd, WindowError> {
        let reservation = self.reservation.as_mut().ok_or(WindowError::NotOpen)?;
        self.context.make_current_if_none()?;
        Ok(reservation.map_exported(addr, size)?)
    }

    fn release(&mut self) -> Result<(), WindowError> {
        if let Some(reservation) = self.reservation.as_mut() {
            self.context.make_current_if_none()?;
            reservation.release()?;
            self.reservation = None;
        }
        self.context.release()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use helios::cuda::CudaError;

    /// Opening the backing goes through Helios's driver loading: without a
    /// driver it is Helios's typed error, with Heliopause's message.
    #[test]
    fn new_without_a_driver_is_helios_typed_error() {
        match CudaBacking::new(0) {
            Err(err @ WindowError::Cuda(CudaError::DriverUnavailable)) => {
                assert!(
                    err.to_string()
                        .starts_with("the CUDA driver cannot be loaded"),
                    "{err}"
                );
            }
            // A driver without a usable device 0.
            Err(WindowError::Cuda(CudaError::Driver { .. })) => {}
            Err(other) => panic!("unexpected error: {other}"),
            Ok(backing) => assert_eq!(backing.ordinal(), 0),
        }
    }
}
