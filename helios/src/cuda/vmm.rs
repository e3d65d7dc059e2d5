//! The driver's virtual memory sequence: an address reservation and the
//! device memory mapped into it, the one copy of it Helios's
//! [`super::Window`] and Heliopause's preparation window both use.
//!
//! Rules enforced here:
//! - [`Reservation::reserve`] asks for a hint and keeps the range wherever
//!   the driver put it (the driver honours a hint only when the range is
//!   free, and returns success elsewhere otherwise): the caller compares
//!   [`Reservation::base`] with its hint and drops a misplaced reservation;
//! - each mapping is one pinned device allocation of exactly the mapped size
//!   (`cuMemCreate`), mapped (`cuMemMap`), its handle dropped at once (the
//!   mapping keeps the memory alive), then granted device read/write access
//!   (`cuMemSetAccess`) and, for [`Reservation::map_zeroed`], zeroed on the
//!   null stream; if any step after the map fails the range is unmapped
//!   again and the first error is reported;
//! - [`Reservation::map_exported`] maps memory another process may map too
//!   and returns its POSIX file descriptor (`cuMemExportToShareableHandle`);
//!   [`Reservation::map_imported`] maps memory another process exported, from
//!   such a descriptor (`cuMemImportFromShareableHandle`), with access for
//!   this reservation's device (the rank processes of a tensor-parallel group
//!   map each other's collective storage this way, at the owner's address);
//! - [`Reservation::release`] waits for the current context's work (nothing
//!   may run on memory about to be unmapped), unmaps every span newest
//!   first, then frees the range; it stops at the first failure with what is
//!   left still recorded, so it can be retried, and is a no-op once done.
//!
//! The owning primary context must be current on the calling thread for
//! every call, drop included.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::error::{check, CudaError};
use super::primary::PrimaryContext;

/// Where device `ordinal`'s memory lives, for allocation and access.
pub(crate) fn location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

/// Pinned device memory on device `ordinal`, with no shareable handle.
pub(crate) fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    allocation_prop_with(
        ordinal,
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
    )
}

/// Pinned device memory on device `ordinal`, shareable as `handles`.
fn allocation_prop_with(
    ordinal: i32,
    handles: sys::CUmemAllocationHandleType,
) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handles,
        location: location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// Where a mapped span's memory comes from.
enum Source<'fd> {
    /// A new allocation on the reservation's device: zeroed or not, and
    /// exportable or not.
    Fresh { zero: bool, export: bool },
    /// Another process's allocation, from its exported descriptor.
    Imported(BorrowedFd<'fd>),
}

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// A reserved device address range and the spans mapped into it.
#[derive(Debug)]
pub struct Reservation {
    ordinal: i32,
    base: u64,
    size: u64,
    /// `(address, length)` of every mapped span, in mapping order.
    mapped: Vec<(u64, usize)>,
    /// Whether the range is still reserved.
    reserved: bool,
}

fn to_len(offset: u64, len: u64, reason: &'static str) -> Result<usize, CudaError> {
    usize::try_from(len).map_err(|_| CudaError::InvalidSpan {
        offset,
        len,
        reason,
    })
}

impl Reservation {
    /// Reserves `size` bytes of address space for `context`'s device, asking
    /// for `hint`. The range may lie elsewhere: see [`Self::base`].
    pub fn reserve(context: &PrimaryContext, hint: u64, size: u64) -> Result<Self, CudaError> {
        let len = to_len(0, size, "the reservation size exceeds usize")?;
        let mut got: sys::CUdeviceptr = 0;
        // SAFETY: the out-pointer points to a local; flags must be 0.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut got, len, 0, hint, 0)
        })?;
        Ok(Self {
            ordinal: context.ordinal(),
            base: got,
            size,
            mapped: Vec::new(),
            reserved: true,
        })
    }

    /// Where the driver placed the range.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Reserved bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes mapped so far.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped.iter().map(|&(_, len)| len as u64).sum()
    }

    /// Backs `[addr, addr + len)` (inside the range, aligned to the
    /// allocation granularity, not mapped yet) with device memory the device
    /// may read and write. Its contents are undefined.
    pub fn map(&mut self, addr: u64, len: u64) -> Result<(), CudaError> {
        let source = Source::Fresh {
            zero: false,
            export: false,
        };
        self.map_span(addr, len, source).map(drop)
    }

    /// [`Self::map`], then fills the span with zeros (queued on the null
    /// stream, so ordered before every later copy and launch).
    pub fn map_zeroed(&mut self, addr: u64, len: u64) -> Result<(), CudaError> {
        let source = Source::Fresh {
            zero: true,
            export: false,
        };
        self.map_span(addr, len, source).map(drop)
    }

    /// [`Self::map_zeroed`] with memory another process may map too: its
    /// POSIX file descriptor, which the caller owns (closing it does not
    /// unmap anything; a process that imported it keeps the memory alive).
    /// Returns once the zeros are written: nothing orders them before
    /// another process's writes.
    pub fn map_exported(&mut self, addr: u64, len: u64) -> Result<OwnedFd, CudaError> {
        let source = Source::Fresh {
            zero: true,
            export: true,
        };
        let fd = self.map_span(addr, len, source)?;
        // SAFETY: plain driver entry point (the owning context is current).
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        Ok(fd.expect("an exported span has a descriptor"))
    }

    /// Maps the memory another process exported as `fd` ([`Self::map_exported`],
    /// exactly `len` bytes) at `addr`, with read/write access for this
    /// reservation's device (on another device than the memory's, that needs
    /// peer access between the two).
    pub fn map_imported(
        &mut self,
        addr: u64,
        len: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<(), CudaError> {
        self.map_span(addr, len, Source::Imported(fd)).map(drop)
    }

    /// Maps `source` at `[addr, addr + len)`; the exported descriptor, when
    /// it exports.
    fn map_span(
        &mut self,
        addr: u64,
        len: u64,
        source: Source<'_>,
    ) -> Result<Option<OwnedFd>, CudaError> {
        let offset = addr.wrapping_sub(self.base);
        let inside =
            addr >= self.base && offset.checked_add(len).is_some_and(|end| end <= self.size);
        if !self.reserved || !inside {
            return Err(CudaError::InvalidSpan {
                offset,
                len,
                reason: "reaches past the reservation",
            });
        }
        let len = to_len(offset, len, "the span length exceeds usize")?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let (zero, export) = match source {
            Source::Fresh { zero, export } => {
                let handles = if export {
                    POSIX_FD
                } else {
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
                };
                let prop = allocation_prop_with(self.ordinal, handles);
                // SAFETY: `prop` and the out-pointer point to locals.
                check("cuMemCreate", unsafe {
                    sys::cuMemCreate(&mut handle, len, &prop, 0)
                })?;
                (zero, export)
            }
            Source::Imported(fd) => {
                // SAFETY: the out-pointer points to a local; a POSIX
                // descriptor is passed as its value in the pointer.
                check("cuMemImportFromShareableHandle", unsafe {
                    sys::cuMemImportFromShareableHandle(
                        &mut handle,
                        fd.as_raw_fd() as usize as *mut c_void,
                        POSIX_FD,
                    )
                })?;
                (false, false)
            }
        };
        // The descriptor, taken before our reference to the memory goes.
        let mut exported: c_int = -1;
        let shared = if export {
            // SAFETY: the out-pointer points to a local `int`, which is what
            // a POSIX descriptor export writes; `handle` is live.
            check("cuMemExportToShareableHandle", unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut exported as *mut c_int).cast(),
                    handle,
                    POSIX_FD,
                    0,
                )
            })
        } else {
            Ok(())
        };
        // SAFETY: `[addr, addr + len)` lies in the reservation (checked
        // above; the caller guarantees it is not mapped yet); `handle` is an
        // allocation of `len` bytes (created, or imported as one).
        let mapped = match shared {
            Ok(()) => unsafe { sys::cuMemMap(addr, len, 0, handle, 0) },
            Err(_) => sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        };
        // The mapping holds its own reference to the memory; drop ours
        // either way.
        // SAFETY: `handle` was created or imported above and is released once.
        let released = unsafe { sys::cuMemRelease(handle) };
        // SAFETY: a descriptor the export wrote is ours alone, closed once
        // (here on failure, else by the caller).
        let fd = (exported >= 0).then(|| unsafe { OwnedFd::from_raw_fd(exported) });
        shared?;
        check("cuMemMap", mapped)?;
        let access = sys::CUmemAccessDesc {
            location: location(self.ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let ready = check("cuMemRelease", released)
            .and_then(|()| {
                // SAFETY: the range was mapped above; one access descriptor.
                check("cuMemSetAccess", unsafe {
                    sys::cuMemSetAccess(addr, len, &access, 1)
                })
            })
            .and_then(|()| {
                if !zero {
                    return Ok(());
                }
                // SAFETY: the range is mapped with read/write access.
                check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(addr, 0, len) })
            });
        if let Err(err) = ready {
            // Best effort: the first error is the one to report.
            // SAFETY: unmaps exactly the range mapped above.
            let _ = unsafe { sys::cuMemUnmap(addr, len) };
            return Err(err);
        }
        self.mapped.push((addr, len));
        Ok(fd)
    }

    /// Grants device `ordinal` read/write access to `[addr, addr + len)`,
    /// which lies in mapped spans of this reservation (a peer device reading
    /// and signalling this device's memory; needs peer access between the
    /// two, [`super::Context::peer_can_access`]).
    pub fn grant_access(&mut self, addr: u64, len: u64, ordinal: i32) -> Result<(), CudaError> {
        let offset = addr.wrapping_sub(self.base);
        let len = to_len(offset, len, "the span length exceeds usize")?;
        let end = addr.checked_add(len as u64);
        let inside = self.mapped.iter().any(|&(start, mapped)| {
            addr >= start && end.is_some_and(|end| end <= start + mapped as u64)
        });
        if !self.reserved || !inside {
            return Err(CudaError::InvalidSpan {
                offset,
                len: len as u64,
                reason: "access is granted to one mapped span, or to part of one",
            });
        }
        let access = sys::CUmemAccessDesc {
            location: location(ordinal),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range lies in one mapped span (checked above); one
        // access descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(addr, len, &access, 1)
        })
    }

    /// Waits for the current context's work, unmaps every span (newest
    /// first) and frees the range. Retryable after a failure; a no-op once
    /// everything is released.
    pub fn release(&mut self) -> Result<(), CudaError> {
        if !self.reserved {
            return Ok(());
        }
        // Nothing may still run on memory about to be unmapped.
        // SAFETY: plain driver entry point.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        while let Some(&(addr, len)) = self.mapped.last() {
            // SAFETY: each span was mapped by `map_span` and is unmapped once
            // (it is forgotten only after the unmap succeeded).
            check("cuMemUnmap", unsafe { sys::cuMemUnmap(addr, len) })?;
            self.mapped.pop();
        }
        // SAFETY: frees the range reserved in `reserve`, once.
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(self.base, self.size as usize)
        })?;
        self.reserved = false;
        Ok(())
    }
}

impl Drop for Reservation {
    /// Releases whatever is still held; errors cannot be reported here.
    fn drop(&mut self) {
        let _ = self.release();
    }
}
