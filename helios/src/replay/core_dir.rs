//! A core directory read and checked on the host, before any CUDA work:
//!
//! ```text
//! CORE/manifest.pb            flare.core.v1.Core (validated into a ValidCore)
//! CORE/buffers.safetensors    initial contents (located, checked per buffer)
//! CORE/images/<sha256>.bin    kernel images (length and digest checked)
//! ```

use std::path::{Path, PathBuf};

use super::digest::sha256_hex;
use super::error::ReplayError;
use super::initial::InitialContents;
use crate::core::{load_manifest, ValidCore};

/// Folder of the kernel images inside a core directory.
pub const IMAGES_DIR: &str = "images";

/// Path of the image with digest `sha256` inside `core_dir`.
pub fn image_path(core_dir: &Path, sha256: &str) -> PathBuf {
    core_dir.join(IMAGES_DIR).join(format!("{sha256}.bin"))
}

/// One kernel image's bytes, exactly as the driver loaded them at export.
#[derive(Debug, Clone)]
pub struct ImageBytes {
    /// SHA-256 of `bytes`, as the manifest names the image.
    pub sha256: String,
    /// The image (cubin, fatbin or PTX).
    pub bytes: Vec<u8>,
}

/// A core directory whose files agree with its manifest.
#[derive(Debug)]
pub struct CoreDir {
    path: PathBuf,
    core: ValidCore,
    images: Vec<ImageBytes>,
    /// Every rank's, in rank order.
    initial: Vec<InitialContents>,
}

impl CoreDir {
    /// Reads the manifest, every kernel image (checking its length and
    /// digest) and the header of the initial contents (checking every
    /// rank's buffers' tensors). The tensors' bytes are read later, when
    /// uploaded.
    pub fn read(path: &Path) -> Result<Self, ReplayError> {
        let core = load_manifest(path)?;
        let images = core
            .images()
            .iter()
            .map(|image| read_image(path, &image.sha256, image.size_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let initial = (core.ranks().into_iter())
            .map(|rank| InitialContents::locate(path, rank))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            path: path.to_owned(),
            core,
            images,
            initial,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The validated manifest.
    pub fn core(&self) -> &ValidCore {
        &self.core
    }

    /// The kernel images, in manifest order.
    pub fn images(&self) -> &[ImageBytes] {
        &self.images
    }

    /// Where every buffer's initial contents lie, per rank in rank order.
    pub fn initial(&self) -> &[InitialContents] {
        &self.initial
    }

    /// The manifest, the images and every rank's initial contents.
    pub fn into_parts(self) -> (ValidCore, Vec<ImageBytes>, Vec<InitialContents>) {
        (self.core, self.images, self.initial)
    }
}

fn read_image(core_dir: &Path, sha256: &str, declared: u64) -> Result<ImageBytes, ReplayError> {
    let path = image_path(core_dir, sha256);
    let bytes = std::fs::read(&path).map_err(|source| ReplayError::Io { path, source })?;
    let found = bytes.len() as u64;
    if found != declared {
        return Err(ReplayError::ImageSize {
            sha256: sha256.to_owned(),
            declared,
            found,
        });
    }
    let digest = sha256_hex(&bytes);
    if digest != sha256 {
        return Err(ReplayError::ImageDigest {
            sha256: sha256.to_owned(),
            found: digest,
        });
    }
    Ok(ImageBytes {
        sha256: sha256.to_owned(),
        bytes,
    })
}
