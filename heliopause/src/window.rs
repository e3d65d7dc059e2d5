//! The preparation allocator ("the window"): pure bookkeeping, no CUDA.
//!
//! A [`Window`] owns one virtual address range reserved at a fixed hint address
//! (`base`, `size`) and lays an ordered table of named regions out in it,
//! contiguously from `base`, each starting on and sized to a multiple of the
//! physical allocation granularity. Allocation happens in the *current region*
//! (chosen with [`Window::select`]):
//!
//! - Sizes are rounded up to the granularity; a zero-byte request takes one
//!   granule, so every live block has a unique address.
//! - A freed block goes onto its region's free list, keyed by its rounded size.
//!   An allocation first reuses the most recently freed block of *exactly* the
//!   same rounded size in the current region (LIFO); otherwise it bumps the
//!   region's top. Blocks are never split or coalesced and the top never moves
//!   down: PyTorch's caching allocator sits above this one and only asks for
//!   whole segments, so exact-size reuse covers its pattern, and addresses stay
//!   deterministic for a deterministic sequence of requests.
//! - Physical memory is mapped on demand, exactly the span the bump pointer
//!   newly covers (the rounded allocation, itself a whole number of granules):
//!   one [`Backing::map`] call per bump, none on reuse. Mapped memory stays
//!   mapped (and is reused) until the window is closed, so a region's mapped
//!   bytes always equal its high-water mark.
//!
//! Invariants (checked by the randomized test): live blocks never overlap and
//! lie inside their region; per region, `live_bytes + free_bytes == high_water
//! == mapped <= capacity`.
//!
//! One exception: an *exported* region ([`Window::export_region`]) is mapped
//! whole at once, with memory another process may map (the tensor-parallel
//! collectives' storage, which each rank's peer maps at this window's
//! address), and nothing is ever allocated from it: its `mapped` is its
//! capacity and its `high_water` stays 0.
//!
//! The physical side sits behind the [`Backing`] trait so this logic is tested
//! with a fake; `cuda_backing` implements it with Helios's CUDA layer (the
//! driver's virtual memory API).

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use helios::cuda::CudaError;

/// The driver honours a reservation's address hint only for reservations of at
/// least this size (32 MiB); smaller ones land wherever the driver likes.
pub const MIN_WINDOW_SIZE: u64 = 32 << 20;

/// Everything that can go wrong in the window, its backing or its C/Python
/// front ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error(
        "region `{region}` is full: requested {requested} bytes (rounded to the granularity), \
         {available} bytes of its capacity left unbumped"
    )]
    RegionFull {
        region: String,
        requested: u64,
        available: u64,
    },
    #[error("no region is selected: call window_select(name) before allocating")]
    NoRegion,
    #[error("unknown region `{name}` (the window has: {known})")]
    UnknownRegion { name: String, known: String },
    #[error(
        "free of pointer {ptr:#x} ({size} bytes) that is not a live block of the window \
         (foreign pointer or double free)"
    )]
    UnknownPointer { ptr: u64, size: u64 },
    #[error(
        "free of pointer {ptr:#x} with {given} bytes, but it was allocated as {recorded} bytes \
         (after rounding); the block stays live"
    )]
    SizeMismatch { ptr: u64, given: u64, recorded: u64 },
    #[error("a window is already open at {base:#x}; close it first")]
    AlreadyOpen { base: u64 },
    #[error("no window is open: call window_open first")]
    NotOpen,
    #[error(
        "window size {size} bytes is below the {minimum}-byte (32 MiB) minimum: the driver \
         ignores the address hint for smaller reservations"
    )]
    TooSmall { size: u64, minimum: u64 },
    #[error(
        "the reservation at hint {hint:#x} came back at {got:#x}: the fixed address range is \
         not available in this process (something else is mapped there)"
    )]
    HintMismatch { hint: u64, got: u64 },
    #[error("invalid window layout: {0}")]
    Layout(String),
    #[error(
        "region `{region}` was exported whole (its memory is shared with another process): \
         nothing is allocated from it"
    )]
    RegionExported { region: String },
    #[error("region `{region}` already holds memory: only an untouched region is exported whole")]
    RegionInUse { region: String },
    #[error("window still has {blocks} live blocks ({bytes} bytes); free them before closing")]
    Busy { blocks: u64, bytes: u64 },
    #[error("negative size {size}")]
    NegativeSize { size: i64 },
    #[error("allocation for device {got}, but the window was opened on device {expected}")]
    WrongDevice { expected: i32, got: i32 },
    /// The driver cannot be loaded, or a driver call failed (Helios's CUDA
    /// layer names the call and the `CUresult`).
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// The physical side of a window: an address reservation plus memory mapped
/// into it on demand.
pub trait Backing {
    /// Physical allocation granularity; every reservation and mapping size and
    /// address is a multiple of it.
    fn granularity(&self) -> Result<u64, WindowError>;
    /// Reserves `size` bytes of address space, asking for `hint`. Returns the
    /// address actually reserved, which may differ from the hint: the caller
    /// compares. The backing keeps the reservation until [`Backing::release`].
    fn reserve(&mut self, hint: u64, size: u64) -> Result<u64, WindowError>;
    /// Backs `[addr, addr + size)` (inside the reservation, granularity
    /// aligned, not yet mapped) with read/write device memory.
    fn map(&mut self, addr: u64, size: u64) -> Result<(), WindowError>;
    /// Backs `[addr, addr + size)` like [`Backing::map`], with zeroed memory
    /// that another process may map, and returns its POSIX file descriptor
    /// (the caller's to close; closing it does not unmap anything here).
    fn map_exported(&mut self, addr: u64, size: u64) -> Result<OwnedFd, WindowError>;
    /// Unmaps everything mapped and frees the reservation. Must be safe to call
    /// again after a partial failure, and a no-op once everything is released.
    fn release(&mut self) -> Result<(), WindowError>;
}

/// Usage of one region, as reported by [`Window::usage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionUsage {
    pub name: String,
    /// Absolute start address (`window base + offset`).
    pub base: u64,
    /// Offset from the window base.
    pub offset: u64,
    /// Reserved capacity (rounded up to the granularity).
    pub capacity: u64,
    /// Bytes ever bumped: the high-water mark of the region's top.
    pub high_water: u64,
    /// Bytes backed by physical memory (equal to `high_water`: see module docs).
    pub mapped: u64,
    /// Bytes in live blocks (rounded sizes).
    pub live_bytes: u64,
    /// Number of live blocks.
    pub live_blocks: u64,
    /// Successful allocations so far (bumped plus reused).
    pub allocations: u64,
    /// Of those, allocations served from the free list.
    pub reused: u64,
    /// Freed blocks waiting for reuse, and their bytes.
    pub free_blocks: u64,
    pub free_bytes: u64,
    /// Whether this is the current region.
    pub selected: bool,
}

#[derive(Debug)]
struct Region {
    name: String,
    offset: u64,
    capacity: u64,
    /// Bump offset within the region (also the high-water mark).
    top: u64,
    /// Offset up to which physical memory is mapped.
    mapped: u64,
    live_bytes: u64,
    live_blocks: u64,
    allocations: u64,
    reused: u64,
    /// Rounded size -> freed block addresses, most recent last.
    free: HashMap<u64, Vec<u64>>,
    free_bytes: u64,
    free_blocks: u64,
    /// Mapped whole by [`Window::export_region`]; never allocated from.
    exported: bool,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    region: usize,
    size: u64,
}

/// The fixed-address preparation allocator over one backing.
#[derive(Debug)]
pub struct Window<B: Backing> {
    backing: B,
    base: u64,
    size: u64,
    granularity: u64,
    regions: Vec<Region>,
    current: Option<usize>,
    live: HashMap<u64, Live>,
}

impl<B: Backing> Window<B> {
    /// Checks what can be checked before any backing exists: the size minimum
    /// and the region table (non-empty, unique non-empty names, non-zero
    /// capacities that fit in `size`).
    pub fn check_request<S: AsRef<str>>(
        base: u64,
        size: u64,
        regions: &[(S, u64)],
    ) -> Result<(), WindowError> {
        if size < MIN_WINDOW_SIZE {
            return Err(WindowError::TooSmall {
                size,
                minimum: MIN_WINDOW_SIZE,
            });
        }
        if base == 0 {
            return Err(WindowError::Layout(
                "base address 0 is not a usable hint".into(),
            ));
        }
        if base.checked_add(size).is_none() {
            return Err(WindowError::Layout(format!(
                "window {base:#x} + {size} bytes overflows the address space"
            )));
        }
        if regions.is_empty() {
            return Err(WindowError::Layout("at least one region is needed".into()));
        }
        let mut total: u64 = 0;
        for (i, (name, capacity)) in regions.iter().enumerate() {
            let name = name.as_ref();
            if name.is_empty() {
                return Err(WindowError::Layout(format!(
                    "region #{i} has an empty name"
                )));
            }
            if regions[..i].iter().any(|(n, _)| n.as_ref() == name) {
                return Err(WindowError::Layout(format!(
                    "region `{name}` is listed twice"
                )));
            }
            if *capacity == 0 {
                return Err(WindowError::Layout(format!(
                    "region `{name}` has zero capacity"
                )));
            }
            total = total.saturating_add(*capacity);
        }
        if total > size {
            return Err(WindowError::Layout(format!(
                "regions need {total} bytes but the window has {size}"
            )));
        }
        Ok(())
    }

    /// Opens a window: validates the layout against the backing's granularity,
    /// reserves `[base, base + size)` and fails with
    /// [`WindowError::HintMismatch`] (after releasing the reservation) if the
    /// backing reserved anywhere else. No memory is mapped yet and no region is
    /// selected.
    pub fn open<S: AsRef<str>>(
        mut backing: B,
        base: u64,
        size: u64,
        regions: &[(S, u64)],
    ) -> Result<Self, WindowError> {
        Self::check_request(base, size, regions)?;
        let granularity = backing.granularity()?;
        if granularity == 0 {
            return Err(WindowError::Layout(
                "the backing reported granularity 0".into(),
            ));
        }
        if !base.is_multiple_of(granularity) {
            return Err(WindowError::Layout(format!(
                "base {base:#x} is not a multiple of the granularity ({granularity} bytes)"
            )));
        }
        if !size.is_multiple_of(granularity) {
            return Err(WindowError::Layout(format!(
                "window size {size} is not a multiple of the granularity ({granularity} bytes)"
            )));
        }
        let mut table = Vec::with_capacity(regions.len());
        let mut offset: u64 = 0;
        for (name, capacity) in regions {
            let name = name.as_ref();
            let capacity = capacity
                .checked_next_multiple_of(granularity)
                .filter(|c| offset.checked_add(*c).is_some_and(|end| end <= size))
                .ok_or_else(|| {
                    WindowError::Layout(format!(
                        "region `{name}` ({capacity} bytes, rounded to {granularity}-byte \
                         granules) does not fit: {offset} of {size} bytes are already laid out"
                    ))
                })?;
            table.push(Region {
                name: name.to_owned(),
                offset,
                capacity,
                top: 0,
                mapped: 0,
                live_bytes: 0,
                live_blocks: 0,
                allocations: 0,
                reused: 0,
                free: HashMap::new(),
                free_bytes: 0,
                free_blocks: 0,
                exported: false,
            });
            offset += capacity;
        }
        let got = backing.reserve(base, size)?;
        if got != base {
            // The reservation exists, just at the wrong place: give it back.
            // The mismatch is the error worth reporting.
            let _ = backing.release();
            return Err(WindowError::HintMismatch { hint: base, got });
        }
        Ok(Self {
            backing,
            base,
            size,
            granularity,
            regions: table,
            current: None,
            live: HashMap::new(),
        })
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    pub fn backing(&self) -> &B {
        &self.backing
    }

    /// Name of the current region, if one is selected.
    pub fn current(&self) -> Option<&str> {
        self.current.map(|i| self.regions[i].name.as_str())
    }

    /// Makes `name` the region that subsequent allocations come from.
    pub fn select(&mut self, name: &str) -> Result<(), WindowError> {
        self.current = Some(self.region_index(name)?);
        Ok(())
    }

    /// Number of live blocks and their bytes, over all regions.
    pub fn live(&self) -> (u64, u64) {
        (
            self.live.len() as u64,
            self.live.values().map(|l| l.size).sum(),
        )
    }

    /// Maps region `name` whole with zeroed memory that another process may
    /// map, before anything was allocated from it, and returns its address,
    /// its size (the region's capacity) and the memory's POSIX descriptor.
    /// Nothing is allocated from it afterwards.
    pub fn export_region(&mut self, name: &str) -> Result<(u64, u64, OwnedFd), WindowError> {
        self.region_index(name)?;
        let region = (self.regions.iter_mut())
            .find(|r| r.name == name)
            .expect("found above");
        if region.exported || region.mapped > 0 || region.allocations > 0 {
            return Err(WindowError::RegionInUse {
                region: name.to_owned(),
            });
        }
        let address = self.base + region.offset;
        let fd = self.backing.map_exported(address, region.capacity)?;
        region.mapped = region.capacity;
        region.exported = true;
        Ok((address, region.capacity, fd))
    }

    fn region_index(&self, name: &str) -> Result<usize, WindowError> {
        (self.regions.iter().position(|r| r.name == name)).ok_or_else(|| {
            WindowError::UnknownRegion {
                name: name.to_owned(),
                known: (self.regions.iter().map(|r| r.name.as_str()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })
    }

    /// Allocates `size` bytes (rounded up to the granularity, at least one
    /// granule) in the current region; see the module docs for the policy.
    pub fn alloc(&mut self, size: u64) -> Result<u64, WindowError> {
        let idx = self.current.ok_or(WindowError::NoRegion)?;
        let region = &mut self.regions[idx];
        if region.exported {
            return Err(WindowError::RegionExported {
                region: region.name.clone(),
            });
        }
        let available = region.capacity - region.top;
        let Some(rounded) = size.max(1).checked_next_multiple_of(self.granularity) else {
            return Err(WindowError::RegionFull {
                region: region.name.clone(),
                requested: size,
                available,
            });
        };
        let reused = region.free.get_mut(&rounded).and_then(Vec::pop);
        let ptr = if let Some(ptr) = reused {
            if region.free.get(&rounded).is_some_and(Vec::is_empty) {
                region.free.remove(&rounded);
            }
            region.free_blocks -= 1;
            region.free_bytes -= rounded;
            region.reused += 1;
            ptr
        } else {
            if rounded > available {
                return Err(WindowError::RegionFull {
                    region: region.name.clone(),
                    requested: rounded,
                    available,
                });
            }
            let new_top = region.top + rounded;
            let region_base = self.base + region.offset;
            if new_top > region.mapped {
                self.backing
                    .map(region_base + region.mapped, new_top - region.mapped)?;
                region.mapped = new_top;
            }
            let ptr = region_base + region.top;
            region.top = new_top;
            ptr
        };
        region.live_bytes += rounded;
        region.live_blocks += 1;
        region.allocations += 1;
        self.live.insert(
            ptr,
            Live {
                region: idx,
                size: rounded,
            },
        );
        Ok(ptr)
    }

    /// Returns a block to its region's free list. `size` must round to the
    /// block's recorded size. Unknown pointers and size mismatches are errors
    /// and leave the window unchanged.
    pub fn free(&mut self, ptr: u64, size: u64) -> Result<(), WindowError> {
        let Some(live) = self.live.get(&ptr).copied() else {
            return Err(WindowError::UnknownPointer { ptr, size });
        };
        let given = size
            .max(1)
            .checked_next_multiple_of(self.granularity)
            .unwrap_or(u64::MAX);
        if given != live.size {
            return Err(WindowError::SizeMismatch {
                ptr,
                given: size,
                recorded: live.size,
            });
        }
        self.live.remove(&ptr);
        let region = &mut self.regions[live.region];
        region.live_bytes -= live.size;
        region.live_blocks -= 1;
        region.free.entry(live.size).or_default().push(ptr);
        region.free_bytes += live.size;
        region.free_blocks += 1;
        Ok(())
    }

    /// Per-region usage, in layout order.
    pub fn usage(&self) -> Vec<RegionUsage> {
        self.regions
            .iter()
            .enumerate()
            .map(|(i, r)| RegionUsage {
                name: r.name.clone(),
                base: self.base + r.offset,
                offset: r.offset,
                capacity: r.capacity,
                high_water: r.top,
                mapped: r.mapped,
                live_bytes: r.live_bytes,
                live_blocks: r.live_blocks,
                allocations: r.allocations,
                reused: r.reused,
                free_blocks: r.free_blocks,
                free_bytes: r.free_bytes,
                selected: self.current == Some(i),
            })
            .collect()
    }

    /// Name of the region containing `ptr`, if it lies inside one.
    pub fn region_of(&self, ptr: u64) -> Option<&str> {
        let off = ptr.checked_sub(self.base)?;
        self.regions
            .iter()
            .find(|r| off >= r.offset && off - r.offset < r.capacity)
            .map(|r| r.name.as_str())
    }

    /// Closes the window: refuses with [`WindowError::Busy`] while blocks are
    /// live, otherwise releases the backing and hands it back. On any error the
    /// window is handed back unchanged (a failed release can be retried).
    pub fn close(mut self) -> Result<B, Box<(Self, WindowError)>> {
        let (blocks, bytes) = self.live();
        if blocks > 0 {
            return Err(Box::new((self, WindowError::Busy { blocks, bytes })));
        }
        match self.backing.release() {
            Ok(()) => Ok(self.backing),
            Err(e) => Err(Box::new((self, e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    const MIB: u64 = 1 << 20;
    const HINT: u64 = 0x2000_0000_0000;

    #[derive(Debug, Default)]
    struct FakeLog {
        reserved: Option<(u64, u64)>,
        maps: Vec<(u64, u64)>,
        exported: Vec<(u64, u64)>,
        releases: u32,
    }

    /// Records every call; can be told to reserve elsewhere or to fail maps.
    #[derive(Debug)]
    struct Fake {
        gran: u64,
        /// Where `reserve` lands: `None` honours the hint.
        land_at: Option<u64>,
        fail_maps: bool,
        log: Rc<RefCell<FakeLog>>,
    }

    impl Fake {
        fn new(gran: u64) -> (Self, Rc<RefCell<FakeLog>>) {
            let log = Rc::new(RefCell::new(FakeLog::default()));
            let fake = Fake {
                gran,
                land_at: None,
                fail_maps: false,
                log: Rc::clone(&log),
            };
            (fake, log)
        }
    }

    impl Backing for Fake {
        fn granularity(&self) -> Result<u64, WindowError> {
            Ok(self.gran)
        }

        fn reserve(&mut self, hint: u64, size: u64) -> Result<u64, WindowError> {
            let mut log = self.log.borrow_mut();
            assert!(log.reserved.is_none(), "reserved twice");
            let at = self.land_at.unwrap_or(hint);
            log.reserved = Some((at, size));
            Ok(at)
        }

        fn map(&mut self, addr: u64, size: u64) -> Result<(), WindowError> {
            if self.fail_maps {
                return Err(WindowError::Cuda(CudaError::Driver {
                    call: "cuMemCreate",
                    code: 2,
                    name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                }));
            }
            let mut log = self.log.borrow_mut();
            let (base, len) = log.reserved.expect("map before reserve");
            assert!(addr >= base && addr + size <= base + len, "map outside");
            assert_eq!(addr % self.gran, 0, "unaligned map address");
            assert_eq!(size % self.gran, 0, "unaligned map size");
            assert!(size > 0);
            for &(a, s) in &log.maps {
                assert!(addr + size <= a || a + s <= addr, "mapped twice");
            }
            log.maps.push((addr, size));
            Ok(())
        }

        fn map_exported(&mut self, addr: u64, size: u64) -> Result<OwnedFd, WindowError> {
            self.map(addr, size)?;
            self.log.borrow_mut().exported.push((addr, size));
            Ok(std::fs::File::open("/dev/null")
                .expect("/dev/null opens")
                .into())
        }

        fn release(&mut self) -> Result<(), WindowError> {
            let mut log = self.log.borrow_mut();
            log.maps.clear();
            log.reserved = None;
            log.releases += 1;
            Ok(())
        }
    }

    fn regions() -> Vec<(&'static str, u64)> {
        vec![
            ("weights", 10 * MIB),
            ("state", 3 * MIB + 1),
            ("scratch", 4 * MIB),
        ]
    }

    fn open(gran: u64) -> (Window<Fake>, Rc<RefCell<FakeLog>>) {
        let (fake, log) = Fake::new(gran);
        let w = Window::open(fake, HINT, 64 * MIB, &regions()).expect("open");
        (w, log)
    }

    #[test]
    fn an_exported_region_is_mapped_whole_once_and_never_allocated_from() {
        let (mut w, log) = open(2 * MIB);
        let (address, size, _fd) = w.export_region("state").expect("export");
        // The region's whole capacity, at its place, in one exportable mapping.
        assert_eq!((address, size), (HINT + 10 * MIB, 4 * MIB));
        assert_eq!(log.borrow().exported, vec![(HINT + 10 * MIB, 4 * MIB)]);
        assert_eq!(log.borrow().maps, vec![(HINT + 10 * MIB, 4 * MIB)]);
        let state = &w.usage()[1];
        assert_eq!(
            (state.mapped, state.high_water, state.live_blocks),
            (4 * MIB, 0, 0)
        );
        w.select("state").unwrap();
        assert!(matches!(
            w.alloc(MIB),
            Err(WindowError::RegionExported { region }) if region == "state"
        ));
        assert!(matches!(
            w.export_region("state"),
            Err(WindowError::RegionInUse { .. })
        ));
        // Other regions allocate as before, and the window closes.
        w.select("scratch").unwrap();
        let ptr = w.alloc(MIB).unwrap();
        assert_eq!(ptr, HINT + 14 * MIB);
        w.free(ptr, MIB).unwrap();
        w.close().expect("close");
    }

    #[test]
    fn only_an_untouched_known_region_is_exported() {
        let (mut w, log) = open(2 * MIB);
        w.select("scratch").unwrap();
        let ptr = w.alloc(MIB).unwrap();
        w.free(ptr, MIB).unwrap();
        // Memory already mapped there (a freed block still is).
        assert!(matches!(
            w.export_region("scratch"),
            Err(WindowError::RegionInUse { region }) if region == "scratch"
        ));
        assert!(matches!(
            w.export_region("collectives"),
            Err(WindowError::UnknownRegion { .. })
        ));
        assert!(log.borrow().exported.is_empty());
    }

    #[test]
    fn layout_is_contiguous_and_aligned() {
        let (w, log) = open(2 * MIB);
        assert_eq!(log.borrow().reserved, Some((HINT, 64 * MIB)));
        assert!(log.borrow().maps.is_empty(), "nothing mapped at open");
        let u = w.usage();
        let layout: Vec<_> = u
            .iter()
            .map(|r| (r.name.as_str(), r.offset, r.capacity))
            .collect();
        assert_eq!(
            layout,
            vec![
                ("weights", 0, 10 * MIB),
                ("state", 10 * MIB, 4 * MIB),
                ("scratch", 14 * MIB, 4 * MIB)
            ]
        );
        for r in &u {
            assert_eq!(r.base, HINT + r.offset);
            assert_eq!(r.base % (2 * MIB), 0);
            assert!(!r.selected);
        }
        assert_eq!(w.region_of(HINT + 10 * MIB), Some("state"));
        assert_eq!(w.region_of(HINT + 18 * MIB), None);
        assert_eq!(w.region_of(HINT - 1), None);
    }

    #[test]
    fn alloc_rounds_bumps_and_maps_only_new_granules() {
        let (mut w, log) = open(2 * MIB);
        assert_eq!(w.alloc(1), Err(WindowError::NoRegion));
        w.select("state").unwrap();
        assert_eq!(w.current(), Some("state"));
        let a = w.alloc(1).unwrap();
        assert_eq!(a, HINT + 10 * MIB);
        let b = w.alloc(MIB + 1).unwrap();
        assert_eq!(b, a + 2 * MIB);
        assert_eq!(
            log.borrow().maps,
            vec![(HINT + 10 * MIB, 2 * MIB), (HINT + 12 * MIB, 2 * MIB)]
        );
        w.select("weights").unwrap();
        assert_eq!(w.alloc(5 * MIB).unwrap(), HINT);
        assert_eq!(log.borrow().maps[2], (HINT, 6 * MIB));
        // Zero bytes still gets a granule of its own.
        w.select("scratch").unwrap();
        let z = w.alloc(0).unwrap();
        assert_eq!(z, HINT + 14 * MIB);
        w.free(z, 0).unwrap();
        // Reuse maps nothing new.
        let maps_before = log.borrow().maps.len();
        assert_eq!(w.alloc(5).unwrap(), z);
        assert_eq!(log.borrow().maps.len(), maps_before);
    }

    #[test]
    fn region_exhaustion_is_a_typed_error() {
        let (mut w, _log) = open(2 * MIB);
        w.select("state").unwrap();
        w.alloc(3 * MIB).unwrap();
        let err = w.alloc(1).unwrap_err();
        assert_eq!(
            err,
            WindowError::RegionFull {
                region: "state".into(),
                requested: 2 * MIB,
                available: 0
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("state") && msg.contains("2097152"), "{msg}");
        // Larger than the whole region, and absurd sizes, fail the same way.
        w.select("scratch").unwrap();
        assert!(matches!(
            w.alloc(4 * MIB + 1),
            Err(WindowError::RegionFull { .. })
        ));
        assert!(matches!(
            w.alloc(u64::MAX),
            Err(WindowError::RegionFull { .. })
        ));
        // A failure changes nothing: the region is still empty.
        assert_eq!(w.alloc(4 * MIB).unwrap(), HINT + 14 * MIB);
    }

    #[test]
    fn reuse_is_lifo_and_exact_size_within_the_region() {
        let (mut w, _log) = open(2 * MIB);
        w.select("weights").unwrap();
        let a = w.alloc(2 * MIB).unwrap();
        let b = w.alloc(2 * MIB).unwrap();
        let c = w.alloc(4 * MIB).unwrap();
        w.free(a, 2 * MIB).unwrap();
        w.free(b, 2 * MIB).unwrap();
        w.free(c, 4 * MIB).unwrap();
        // Another region does not see weights' free blocks.
        w.select("scratch").unwrap();
        assert_eq!(w.alloc(2 * MIB).unwrap(), HINT + 14 * MIB);
        w.select("weights").unwrap();
        assert_eq!(w.alloc(2 * MIB).unwrap(), b, "most recently freed first");
        assert_eq!(w.alloc(1).unwrap(), a);
        // No same-size block left: bump, even though a 4 MiB block is free.
        assert_eq!(w.alloc(2 * MIB).unwrap(), c + 4 * MIB);
        assert_eq!(w.alloc(4 * MIB).unwrap(), c);
        let u = &w.usage()[0];
        assert_eq!(u.reused, 3);
        assert_eq!(u.allocations, 7);
        assert_eq!(u.free_blocks, 0);
    }

    #[test]
    fn unknown_free_and_size_mismatch_are_errors_not_panics() {
        let (mut w, _log) = open(2 * MIB);
        w.select("weights").unwrap();
        let a = w.alloc(3 * MIB).unwrap();
        assert_eq!(
            w.free(a + 2 * MIB, 1),
            Err(WindowError::UnknownPointer {
                ptr: a + 2 * MIB,
                size: 1
            })
        );
        assert_eq!(
            w.free(0xdead, 8),
            Err(WindowError::UnknownPointer {
                ptr: 0xdead,
                size: 8
            })
        );
        assert_eq!(
            w.free(a, 2 * MIB),
            Err(WindowError::SizeMismatch {
                ptr: a,
                given: 2 * MIB,
                recorded: 4 * MIB
            })
        );
        assert_eq!(w.live(), (1, 4 * MIB));
        w.free(a, 3 * MIB).unwrap();
        assert_eq!(
            w.free(a, 3 * MIB),
            Err(WindowError::UnknownPointer {
                ptr: a,
                size: 3 * MIB
            }),
            "double free"
        );
        assert!(matches!(
            w.select("nope"),
            Err(WindowError::UnknownRegion { ref known, .. }) if known == "weights, state, scratch"
        ));
    }

    #[test]
    fn hint_mismatch_fails_and_releases() {
        let (mut fake, log) = Fake::new(2 * MIB);
        fake.land_at = Some(0x7f00_0000_0000);
        let err = Window::open(fake, HINT, 64 * MIB, &regions()).unwrap_err();
        assert_eq!(
            err,
            WindowError::HintMismatch {
                hint: HINT,
                got: 0x7f00_0000_0000
            }
        );
        assert_eq!(log.borrow().releases, 1);
        assert_eq!(log.borrow().reserved, None);
    }

    fn many(n: usize) -> Vec<(String, u64)> {
        (0..n).map(|i| (format!("r{i}"), 1)).collect()
    }

    #[test]
    fn small_windows_and_bad_layouts_are_refused_before_reserving() {
        let owned = |v: Vec<(&str, u64)>| -> Vec<(String, u64)> {
            v.into_iter().map(|(n, c)| (n.to_owned(), c)).collect()
        };
        type Case = (u64, u64, Vec<(String, u64)>);
        let cases: Vec<Case> = vec![
            (HINT, 32 * MIB - 1, owned(vec![("a", MIB)])),
            (HINT, 64 * MIB, owned(vec![])),
            (HINT, 64 * MIB, owned(vec![("a", MIB), ("a", MIB)])),
            (HINT, 64 * MIB, owned(vec![("", MIB)])),
            (HINT, 64 * MIB, owned(vec![("a", 0)])),
            (HINT, 64 * MIB, owned(vec![("a", 60 * MIB), ("b", 5 * MIB)])),
            // Fits before rounding, not after: 33 one-byte regions need 33 granules.
            (HINT, 64 * MIB, many(33)),
            (HINT + MIB, 64 * MIB, owned(vec![("a", MIB)])),
            (HINT, 65 * MIB, owned(vec![("a", MIB)])),
            (0, 64 * MIB, owned(vec![("a", MIB)])),
        ];
        for (base, size, regs) in cases {
            let (fake, log) = Fake::new(2 * MIB);
            let err = Window::open(fake, base, size, &regs).unwrap_err();
            assert!(
                matches!(err, WindowError::TooSmall { .. } | WindowError::Layout(_)),
                "{base:#x} {size} {regs:?}: {err}"
            );
            assert_eq!(log.borrow().reserved, None, "{err}");
        }
        let err = Window::<Fake>::check_request(HINT, 16 * MIB, &[("a", MIB)]).unwrap_err();
        assert_eq!(
            err,
            WindowError::TooSmall {
                size: 16 * MIB,
                minimum: 32 * MIB
            }
        );
        assert!(err.to_string().contains("32 MiB"));
        // 32 one-byte regions fill the 32 granules exactly.
        let (fake, _log) = Fake::new(2 * MIB);
        let w = Window::open(fake, HINT, 64 * MIB, &many(32)).unwrap();
        assert_eq!(w.usage()[31].offset, 62 * MIB);
    }

    #[test]
    fn map_failure_leaves_the_region_unchanged() {
        let (mut fake, _log) = Fake::new(2 * MIB);
        fake.fail_maps = true;
        let mut w = Window::open(fake, HINT, 64 * MIB, &regions()).unwrap();
        w.select("weights").unwrap();
        let err = w.alloc(1).unwrap_err();
        assert!(
            matches!(
                err,
                WindowError::Cuda(CudaError::Driver {
                    call: "cuMemCreate",
                    ..
                })
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (CUresult 2)"
        );
        let u = &w.usage()[0];
        assert_eq!(
            (u.high_water, u.mapped, u.live_blocks, u.allocations),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn usage_stats_and_close() {
        let (mut w, log) = open(2 * MIB);
        w.select("weights").unwrap();
        let a = w.alloc(MIB).unwrap();
        let b = w.alloc(3 * MIB).unwrap();
        w.select("scratch").unwrap();
        let c = w.alloc(2 * MIB).unwrap();
        w.free(a, MIB).unwrap();
        let u = w.usage();
        let weights = &u[0];
        assert_eq!(weights.capacity, 10 * MIB);
        assert_eq!(weights.high_water, 6 * MIB);
        assert_eq!(weights.mapped, 6 * MIB);
        assert_eq!(weights.live_bytes, 4 * MIB);
        assert_eq!(weights.live_blocks, 1);
        assert_eq!(weights.allocations, 2);
        assert_eq!((weights.free_blocks, weights.free_bytes), (1, 2 * MIB));
        assert!(!weights.selected);
        assert!(u[2].selected);
        assert_eq!((u[2].live_bytes, u[2].high_water), (2 * MIB, 2 * MIB));
        assert_eq!((u[1].high_water, u[1].allocations), (0, 0));
        assert_eq!(w.live(), (2, 6 * MIB));

        let (mut w, err) = *w.close().unwrap_err();
        assert_eq!(
            err,
            WindowError::Busy {
                blocks: 2,
                bytes: 6 * MIB
            }
        );
        assert_eq!(log.borrow().releases, 0);
        w.free(b, 3 * MIB).unwrap();
        w.free(c, 2 * MIB).unwrap();
        let fake = w.close().expect("close");
        assert_eq!(log.borrow().releases, 1);
        assert!(log.borrow().maps.is_empty());
        drop(fake);
    }

    /// xorshift64*: enough randomness for a seeded invariant test, no dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn randomized_alloc_free_keeps_invariants() {
        const GRAN: u64 = 64 << 10;
        let names = ["weights", "state", "scratch", "tiny"];
        let caps = [12 * MIB, 5 * MIB + 3, 8 * MIB, 256 << 10];
        for seed in [0x9E37_79B9_7F4A_7C15_u64, 1, 0xDEAD_BEEF, 42] {
            let mut rng = XorShift(seed);
            let (fake, log) = Fake::new(GRAN);
            let regs: Vec<(&str, u64)> = names.iter().copied().zip(caps).collect();
            let mut w = Window::open(fake, HINT, 32 * MIB, &regs).unwrap();
            // The test's own model: ptr -> (region index, requested size, rounded).
            let mut live: Vec<(u64, usize, u64, u64)> = Vec::new();
            let mut allocs = [0u64; 4];
            let mut current = None;
            let (mut fulls, mut reuses_seen) = (0, 0);
            for step in 0..5000 {
                match rng.below(10) {
                    0 => {
                        let r = rng.below(names.len() as u64) as usize;
                        w.select(names[r]).unwrap();
                        current = Some(r);
                    }
                    1..=5 => {
                        // A few recurring sizes (so reuse happens) plus odd ones.
                        let size = match rng.below(4) {
                            0 => GRAN,
                            1 => 3 * GRAN,
                            2 => rng.below(5 * GRAN),
                            _ => rng.below(2 * MIB),
                        };
                        let before = w.usage();
                        match (current, w.alloc(size)) {
                            (None, Err(WindowError::NoRegion)) => {}
                            (Some(r), Ok(ptr)) => {
                                let rounded = size.max(1).next_multiple_of(GRAN);
                                if before[r].free_blocks > w.usage()[r].free_blocks {
                                    reuses_seen += 1;
                                }
                                live.push((ptr, r, size, rounded));
                                allocs[r] += 1;
                            }
                            (Some(r), Err(WindowError::RegionFull { region, .. })) => {
                                assert_eq!(region, names[r]);
                                assert_eq!(before, w.usage(), "a failed alloc changed state");
                                fulls += 1;
                            }
                            (cur, res) => panic!("step {step}: {cur:?} -> {res:?}"),
                        }
                    }
                    6..=8 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let (ptr, _, size, _) = live.swap_remove(i);
                        w.free(ptr, size).unwrap();
                    }
                    _ => {
                        // A pointer that is not live: must be refused, state unchanged.
                        let ptr = HINT + rng.below(32 * MIB);
                        if !live.iter().any(|l| l.0 == ptr) {
                            let before = w.usage();
                            assert!(matches!(
                                w.free(ptr, 1),
                                Err(WindowError::UnknownPointer { .. })
                            ));
                            assert_eq!(before, w.usage());
                        }
                    }
                }
                check_invariants(&w, &log.borrow(), &live, &allocs, GRAN);
            }
            assert!(
                fulls > 0 && reuses_seen > 0,
                "seed {seed}: {fulls} {reuses_seen}"
            );
            for (ptr, _, size, _) in live.drain(..) {
                w.free(ptr, size).unwrap();
            }
            w.close().expect("close after freeing everything");
        }
    }

    fn check_invariants(
        w: &Window<Fake>,
        log: &FakeLog,
        live: &[(u64, usize, u64, u64)],
        allocs: &[u64],
        gran: u64,
    ) {
        let usage = w.usage();
        // Blocks: aligned, inside their region and below its top, no overlap.
        let mut spans: Vec<(u64, u64)> = live.iter().map(|l| (l.0, l.0 + l.3)).collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "overlap: {pair:?}");
        }
        for &(ptr, r, _, rounded) in live {
            let u = &usage[r];
            assert_eq!(ptr % gran, 0);
            assert!(ptr >= u.base && ptr + rounded <= u.base + u.high_water);
            assert_eq!(w.region_of(ptr), Some(u.name.as_str()));
        }
        // Counters agree with the model and with each other.
        let mut mapped_total = 0;
        for (r, u) in usage.iter().enumerate() {
            let mine: Vec<_> = live.iter().filter(|l| l.1 == r).collect();
            assert_eq!(u.live_blocks, mine.len() as u64);
            assert_eq!(u.live_bytes, mine.iter().map(|l| l.3).sum::<u64>());
            assert_eq!(u.allocations, allocs[r]);
            assert_eq!(u.live_bytes + u.free_bytes, u.high_water);
            assert_eq!(u.mapped, u.high_water);
            assert!(u.high_water <= u.capacity);
            assert!(u.reused <= u.allocations);
            mapped_total += u.mapped;
        }
        assert_eq!(w.live().0, live.len() as u64);
        // The backing saw exactly the bumped spans: disjoint (checked in map) and
        // each inside one region's bumped range.
        assert_eq!(log.maps.iter().map(|m| m.1).sum::<u64>(), mapped_total);
        for &(a, s) in &log.maps {
            assert!(
                usage
                    .iter()
                    .any(|u| a >= u.base && a + s <= u.base + u.high_water),
                "map {a:#x}+{s} outside every region's bumped span"
            );
        }
    }
}
