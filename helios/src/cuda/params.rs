//! A kernel node's arguments, built from the manifest's parameter block.
//!
//! The manifest keeps one layout for both launch modes: the device-side
//! parameter buffer, parameter `i` at `param_offsets[i]` with
//! `param_sizes[i]` bytes. A `kernelParams` launch passes one pointer per
//! parameter into that block; an `extra` launch (how cuBLAS launches) passes
//! the whole block as `CU_LAUNCH_PARAM_BUFFER_POINTER`.

use std::ffi::c_void;
use std::ops::Range;
use std::ptr;

use cudarc::driver::sys;

/// A parameter layout that does not fit its parameter block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// `param_offsets` and `param_sizes` differ in length.
    #[error("{offsets} parameter offsets but {sizes} parameter sizes")]
    LayoutLength {
        /// Number of offsets.
        offsets: usize,
        /// Number of sizes.
        sizes: usize,
    },
    /// A parameter reaches past the end of the block.
    #[error(
        "parameter {index} ({size} bytes at offset {offset}) lies outside the \
         {len}-byte parameter block"
    )]
    OutsideBlock {
        /// Position of the parameter.
        index: usize,
        /// Its offset in the block.
        offset: u32,
        /// Its size in bytes.
        size: u32,
        /// Length of the block.
        len: usize,
    },
}

/// The byte range of every parameter inside a block of `len` bytes, checked.
pub fn param_ranges(
    len: usize,
    offsets: &[u32],
    sizes: &[u32],
) -> Result<Vec<Range<usize>>, ParamError> {
    if offsets.len() != sizes.len() {
        return Err(ParamError::LayoutLength {
            offsets: offsets.len(),
            sizes: sizes.len(),
        });
    }
    offsets
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(index, (&offset, &size))| {
            let start = offset as usize;
            match start.checked_add(size as usize) {
                Some(end) if end <= len => Ok(start..end),
                _ => Err(ParamError::OutsideBlock {
                    index,
                    offset,
                    size,
                    len,
                }),
            }
        })
        .collect()
}

/// The five words of an `extra` array that passes one parameter block:
/// `[BUFFER_POINTER, block, BUFFER_SIZE, &len, END]`.
pub fn extra_words(block: *mut c_void, len: *mut usize) -> [*mut c_void; 5] {
    [
        sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
        block,
        sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
        len.cast(),
        sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
    ]
}

/// How the block is handed to the driver. The pointer arrays are refreshed
/// from the block each time they are handed out, so they always carry the
/// block's current address.
#[derive(Debug)]
enum Passing {
    /// One pointer per parameter into the block, at these offsets.
    Pointers {
        offsets: Vec<usize>,
        pointers: Vec<*mut c_void>,
    },
    /// The whole block through `extra`; the length and the array are boxed
    /// so their addresses stay put while the owner moves.
    Extra {
        len: Box<usize>,
        words: Box<[*mut c_void; 5]>,
    },
}

/// A kernel node's parameter block and the pointer arrays into it.
///
/// The driver copies the values when the node is added; the block is kept
/// anyway, owned with the graph, so no pointer handed out ever dangles.
#[derive(Debug)]
pub struct KernelArgs {
    block: Vec<u8>,
    passing: Passing,
}

impl KernelArgs {
    /// Checks the layout against the block and prepares the pointer array
    /// (`from_extra`: the `extra` array instead).
    pub fn new(
        block: Vec<u8>,
        offsets: &[u32],
        sizes: &[u32],
        from_extra: bool,
    ) -> Result<Self, ParamError> {
        let ranges = param_ranges(block.len(), offsets, sizes)?;
        let passing = if from_extra {
            Passing::Extra {
                len: Box::new(block.len()),
                words: Box::new([ptr::null_mut(); 5]),
            }
        } else {
            Passing::Pointers {
                offsets: ranges.iter().map(|range| range.start).collect(),
                pointers: vec![ptr::null_mut(); ranges.len()],
            }
        };
        Ok(Self { block, passing })
    }

    /// The parameter block.
    pub fn block(&self) -> &[u8] {
        &self.block
    }

    /// `kernelParams` for the node: null for an `extra` launch or a kernel
    /// without parameters. The array and the block are on the heap, so it
    /// stays valid while `self` lives.
    pub(crate) fn kernel_params(&mut self) -> *mut *mut c_void {
        let base = self.block.as_mut_ptr();
        match &mut self.passing {
            Passing::Pointers { offsets, pointers } if !pointers.is_empty() => {
                for (pointer, &offset) in pointers.iter_mut().zip(offsets.iter()) {
                    // `wrapping_add` stays inside the block (checked by
                    // `param_ranges`) or one past its end for a zero-sized
                    // parameter there.
                    *pointer = base.wrapping_add(offset).cast();
                }
                pointers.as_mut_ptr()
            }
            _ => ptr::null_mut(),
        }
    }

    /// `extra` for the node: null unless the block is passed through it.
    /// Stays valid while `self` lives, like [`KernelArgs::kernel_params`].
    pub(crate) fn extra(&mut self) -> *mut *mut c_void {
        let base = self.block.as_mut_ptr();
        match &mut self.passing {
            Passing::Extra { len, words } => {
                **words = extra_words(base.cast(), &mut **len);
                words.as_mut_ptr()
            }
            Passing::Pointers { .. } => ptr::null_mut(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> Vec<u8> {
        (0u8..24).collect()
    }

    #[test]
    fn ranges_follow_offsets_and_sizes() {
        let ranges = param_ranges(24, &[0, 8, 16], &[8, 4, 8]).unwrap();
        assert_eq!(ranges, vec![0..8, 8..12, 16..24]);
    }

    #[test]
    fn a_parameter_past_the_block_is_rejected() {
        let err = param_ranges(24, &[0, 20], &[8, 8]).unwrap_err();
        assert_eq!(
            err,
            ParamError::OutsideBlock {
                index: 1,
                offset: 20,
                size: 8,
                len: 24
            }
        );
    }

    #[test]
    fn an_offset_that_overflows_is_rejected() {
        let err = param_ranges(24, &[u32::MAX], &[u32::MAX]).unwrap_err();
        assert!(matches!(err, ParamError::OutsideBlock { index: 0, .. }));
    }

    #[test]
    fn offsets_and_sizes_must_pair_up() {
        let err = param_ranges(24, &[0, 8], &[8]).unwrap_err();
        assert_eq!(
            err,
            ParamError::LayoutLength {
                offsets: 2,
                sizes: 1
            }
        );
    }

    #[test]
    fn a_zero_sized_parameter_at_the_end_is_accepted() {
        assert_eq!(param_ranges(8, &[8], &[0]).unwrap(), vec![8..8]);
    }

    #[test]
    fn kernel_params_point_at_each_parameter() {
        let mut args = KernelArgs::new(block(), &[0, 8, 16], &[8, 4, 8], false).unwrap();
        assert!(args.extra().is_null());
        let base = args.block().as_ptr() as usize;
        let array = args.kernel_params();
        assert!(!array.is_null());
        for (index, offset) in [0usize, 8, 16].into_iter().enumerate() {
            // SAFETY: the array holds one pointer per parameter (3).
            let pointer = unsafe { *array.add(index) } as usize;
            assert_eq!(pointer, base + offset);
            // SAFETY: the pointer lies inside the block, which `args` owns.
            assert_eq!(unsafe { *(pointer as *const u8) }, offset as u8);
        }
    }

    #[test]
    fn pointers_follow_the_block_when_the_owner_moves() {
        let args = KernelArgs::new(block(), &[8], &[8], false).unwrap();
        let mut moved = Box::new(args);
        let base = moved.block().as_ptr() as usize;
        // SAFETY: one parameter, so the array holds one pointer.
        let pointer = unsafe { *moved.kernel_params() } as usize;
        assert_eq!(pointer, base + 8);
    }

    #[test]
    fn no_parameters_pass_null() {
        let mut args = KernelArgs::new(Vec::new(), &[], &[], false).unwrap();
        assert!(args.kernel_params().is_null());
        assert!(args.extra().is_null());
    }

    #[test]
    fn extra_passes_the_whole_block() {
        let mut args = KernelArgs::new(block(), &[0, 8], &[8, 8], true).unwrap();
        assert!(args.kernel_params().is_null());
        let base = args.block().as_ptr() as usize;
        let extra = args.extra();
        // SAFETY: the extra array has five words.
        let words: Vec<usize> = (0..5).map(|i| unsafe { *extra.add(i) } as usize).collect();
        assert_eq!(words[0], 1, "CU_LAUNCH_PARAM_BUFFER_POINTER");
        assert_eq!(words[1], base);
        assert_eq!(words[2], 2, "CU_LAUNCH_PARAM_BUFFER_SIZE");
        // SAFETY: the size word points at the boxed length `args` owns.
        assert_eq!(unsafe { *(words[3] as *const usize) }, 24);
        assert_eq!(words[4], 0, "CU_LAUNCH_PARAM_END");
    }

    #[test]
    fn extra_still_checks_the_layout() {
        let err = KernelArgs::new(block(), &[20], &[8], true).unwrap_err();
        assert!(matches!(err, ParamError::OutsideBlock { index: 0, .. }));
    }
}
