//! Kernel images loaded as modules, found by their digest, and the functions
//! in them with the attributes a launch needs.

use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::marker::PhantomData;
use std::ptr;
use std::rc::Rc;

use cudarc::driver::sys;

use super::context::Context;
use super::error::{check, CudaError};

/// One loaded kernel image (cubin, fatbin or PTX).
#[derive(Debug)]
pub struct Module {
    context: Rc<Context>,
    raw: sys::CUmodule,
}

/// `image` copied into 8-byte aligned memory with at least one zero byte
/// after it: ELF and fatbin headers are read as aligned words, and PTX must
/// be NUL-terminated. The zero padding changes nothing for binary images.
fn aligned_copy(image: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; image.len() / 8 + 1];
    // SAFETY: `words` holds `8 * (len / 8 + 1) > len` bytes, and the two
    // buffers are distinct allocations.
    unsafe {
        ptr::copy_nonoverlapping(image.as_ptr(), words.as_mut_ptr().cast::<u8>(), image.len());
    }
    words
}

impl Module {
    /// Loads a kernel image exactly as the driver loaded it at export.
    pub fn load(context: &Rc<Context>, image: &[u8]) -> Result<Self, CudaError> {
        let words = aligned_copy(image);
        let mut raw: sys::CUmodule = ptr::null_mut();
        // SAFETY: `words` is a complete, aligned, NUL-padded image that
        // outlives the call; the out-pointer points to a local.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut raw, words.as_ptr().cast())
        })?;
        Ok(Self {
            context: Rc::clone(context),
            raw,
        })
    }

    /// The function called `name` in this module.
    pub fn function(&self, name: &str) -> Result<Function<'_>, CudaError> {
        let c_name = CString::new(name).map_err(|_| CudaError::InvalidNode {
            reason: format!("function name {name:?} contains a NUL byte"),
        })?;
        let mut raw: sys::CUfunction = ptr::null_mut();
        // SAFETY: the module is loaded, the name is NUL-terminated and the
        // out-pointer points to a local.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut raw, self.raw, c_name.as_ptr())
        })?;
        Ok(Function {
            raw,
            _module: PhantomData,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.context.bind();
        // SAFETY: the module was loaded in `load` and is unloaded once; every
        // graph using its functions is destroyed before (see `Function`).
        let _ = unsafe { sys::cuModuleUnload(self.raw) };
    }
}

/// A function of a loaded module; it cannot outlive the module.
#[derive(Debug, Clone, Copy)]
pub struct Function<'m> {
    raw: sys::CUfunction,
    _module: PhantomData<&'m Module>,
}

impl Function<'_> {
    fn set(
        &self,
        attribute: sys::CUfunction_attribute,
        value: u32,
        what: &str,
    ) -> Result<(), CudaError> {
        let value = c_int::try_from(value).map_err(|_| CudaError::InvalidNode {
            reason: format!("{what} {value} does not fit a function attribute"),
        })?;
        // SAFETY: the function belongs to a loaded module.
        check("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(self.raw, attribute, value)
        })
    }

    /// Allows launches with up to `bytes` of dynamic shared memory (needed
    /// above 48 KiB).
    pub fn set_max_dynamic_shared_bytes(&self, bytes: u32) -> Result<(), CudaError> {
        self.set(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes,
            "max_dynamic_shared_bytes",
        )
    }

    /// Allows clusters above the portable size.
    pub fn allow_non_portable_cluster_size(&self) -> Result<(), CudaError> {
        self.set(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
            "non_portable_cluster_size_allowed",
        )
    }

    pub(crate) fn raw(&self) -> sys::CUfunction {
        self.raw
    }
}

/// Every loaded module, by the SHA-256 of its image.
#[derive(Debug, Default)]
pub struct Modules {
    by_digest: HashMap<String, Module>,
}

impl Modules {
    /// No modules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads `image` as the module for `sha256` (replacing none: a digest
    /// already loaded is kept).
    pub fn load(
        &mut self,
        context: &Rc<Context>,
        sha256: &str,
        image: &[u8],
    ) -> Result<(), CudaError> {
        if !self.by_digest.contains_key(sha256) {
            let module = Module::load(context, image)?;
            self.by_digest.insert(sha256.to_owned(), module);
        }
        Ok(())
    }

    /// The function called `name` in the image with digest `sha256`.
    pub fn function(&self, sha256: &str, name: &str) -> Result<Function<'_>, CudaError> {
        self.by_digest
            .get(sha256)
            .ok_or_else(|| CudaError::ImageNotLoaded {
                sha256: sha256.to_owned(),
            })?
            .function(name)
    }

    /// Number of loaded modules.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether no module is loaded.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_copy_keeps_the_bytes_and_ends_in_zero() {
        for len in [0usize, 1, 7, 8, 9, 4096] {
            let image: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let words = aligned_copy(&image);
            assert_eq!(words.as_ptr() as usize % 8, 0);
            // SAFETY: reading the words' own bytes.
            let bytes =
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) };
            assert_eq!(&bytes[..len], &image[..]);
            assert!(bytes.len() > len);
            assert_eq!(bytes[len], 0);
        }
    }
}
