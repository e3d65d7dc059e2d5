//! Core directories written by tests: the sample manifest, initial tensors
//! in `buffers.safetensors` and kernel images under `images/`.

#![allow(dead_code)] // each test binary uses part of it

use std::path::{Path, PathBuf};

use helios::core::prost::Message;
use helios::core::proto::{node::Op, Core};
use helios::replay::{image_path, sha256_hex, BUFFERS_FILE};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// A fresh, empty directory under Cargo's temporary directory for
/// integration tests.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One initial tensor as it goes into `buffers.safetensors`.
#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Tensor {
    /// A tensor of `shape` whose bytes count up from `seed`.
    pub fn counting(name: &str, dtype: Dtype, shape: &[usize], seed: u8) -> Self {
        let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        Self {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            data: (0..len).map(|i| seed.wrapping_add(i as u8)).collect(),
        }
    }
}

/// The bytes of a safetensors file holding `tensors`.
pub fn safetensors_bytes(tensors: &[Tensor]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let view = TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap();
            (t.name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// Makes `image` the core's only kernel image: declared with its digest and
/// size, and named by every kernel node.
pub fn use_image(core: &mut Core, image: &[u8]) -> String {
    let digest = sha256_hex(image);
    core.images[0].sha256 = digest.clone();
    core.images[0].size_bytes = image.len() as u64;
    for graph in &mut core.graphs {
        for node in &mut graph.nodes {
            if let Some(Op::Kernel(kernel)) = &mut node.op {
                kernel.image_sha256 = digest.clone();
            }
        }
    }
    digest
}

/// Writes a core directory: the manifest, `buffers.safetensors` when any
/// tensor is given, and every image under its digest.
pub fn write_core(dir: &Path, core: &Core, tensors: &[Tensor], images: &[&[u8]]) {
    std::fs::write(dir.join("manifest.pb"), core.encode_to_vec()).unwrap();
    if !tensors.is_empty() {
        std::fs::write(dir.join(BUFFERS_FILE), safetensors_bytes(tensors)).unwrap();
    }
    for image in images {
        let path = image_path(dir, &sha256_hex(image));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, image).unwrap();
    }
}

/// Names the tensor holding buffer `buffer`'s initial contents.
pub fn give_initial(core: &mut Core, buffer: &str, tensor: &str) {
    let entry = core.buffers.iter_mut().find(|b| b.name == buffer).unwrap();
    entry.initial_tensor = tensor.to_owned();
}
