//! Initial buffer contents in `buffers.safetensors`: located and checked
//! against the manifest from the file's header alone, then read in bounded
//! pieces while uploading, so a large core is never held in host memory
//! whole. Several threads read pieces at their offsets while the caller
//! uploads the ones already read (`InitialContents::read_pieces`): one
//! thread reading then uploading each tensor loaded the hybrid's 72 GB core
//! in 36 s, 25.5 of them reading from a memory-backed file system.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use safetensors::tensor::Metadata;
use safetensors::Dtype;

use super::error::ReplayError;
use crate::core::proto::{Buffer, DType};
use crate::core::RankView;

/// File name of the initial contents inside a core directory.
pub const BUFFERS_FILE: &str = "buffers.safetensors";

/// Bytes of the little-endian header length that starts a safetensors file.
const HEADER_LEN_BYTES: u64 = 8;
/// The safetensors format's limit on the JSON header.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Whether a view with `shape` and `strides` (in elements) is contiguous in
/// row-major order. Dimensions of size 1 may have any stride, and an empty
/// view is contiguous.
pub fn is_contiguous(shape: &[u64], strides: &[u64]) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1u64;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim != 1 && stride != expected {
            return false;
        }
        let Some(next) = expected.checked_mul(dim) else {
            return false;
        };
        expected = next;
    }
    true
}

/// The safetensors dtype holding a manifest dtype.
fn safetensors_dtype(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::DtypeUnspecified => None,
        DType::DtypeBf16 => Some(Dtype::BF16),
        DType::DtypeF16 => Some(Dtype::F16),
        DType::DtypeF32 => Some(Dtype::F32),
        DType::DtypeI32 => Some(Dtype::I32),
        DType::DtypeI64 => Some(Dtype::I64),
        DType::DtypeU8 => Some(Dtype::U8),
    }
}

/// One buffer's initial contents: where they lie in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialUpload {
    /// Position of the buffer in the manifest.
    pub buffer: usize,
    /// Offset of the tensor's bytes in the file.
    pub file_offset: u64,
    /// Length of the tensor's bytes (the buffer's dense extent).
    pub len: u64,
}

/// Every buffer's initial contents, located in `buffers.safetensors`.
#[derive(Debug, Clone)]
pub struct InitialContents {
    path: PathBuf,
    uploads: Vec<InitialUpload>,
}

impl InitialContents {
    /// Locates the initial tensor of every buffer of `rank` that names one
    /// (a peer's are stored under names of their own) and checks
    /// it: present, with the buffer's dtype and shape, and the buffer
    /// contiguous. The file is not needed when no buffer names a tensor.
    pub fn locate(core_dir: &Path, rank: RankView<'_>) -> Result<Self, ReplayError> {
        let path = core_dir.join(BUFFERS_FILE);
        let wanted: Vec<(usize, &Buffer)> = (rank.buffers().iter().enumerate())
            .filter(|(_, buffer)| !buffer.initial_tensor.is_empty())
            .collect();
        if wanted.is_empty() {
            return Ok(Self {
                path,
                uploads: Vec::new(),
            });
        }
        for (_, buffer) in &wanted {
            if !is_contiguous(&buffer.shape, &buffer.strides) {
                return Err(ReplayError::NonContiguous {
                    buffer: buffer.name.clone(),
                });
            }
        }
        let (data_start, header) = read_header(&path)?;
        let mut uploads = Vec::with_capacity(wanted.len());
        for (position, buffer) in wanted {
            let upload = locate_one(buffer, &header, data_start)?;
            uploads.push(InitialUpload {
                buffer: position,
                ..upload
            });
        }
        Ok(Self { path, uploads })
    }

    /// The buffers to upload, in manifest order.
    pub fn uploads(&self) -> &[InitialUpload] {
        &self.uploads
    }

    /// Bytes of all initial contents together.
    pub fn bytes(&self) -> u64 {
        self.uploads.iter().map(|upload| upload.len).sum()
    }

    /// Opens the file for reading the tensors.
    pub fn reader(&self) -> Result<TensorReader, ReplayError> {
        let file = File::open(&self.path).map_err(|source| ReplayError::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(TensorReader {
            file,
            path: self.path.clone(),
        })
    }
}

/// One piece of an initial tensor: `len` bytes at `offset` within buffer
/// `upload.buffer`'s contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece<'a> {
    /// The tensor the piece belongs to.
    pub upload: &'a InitialUpload,
    /// Offset of the piece within the tensor (and the buffer).
    pub offset: u64,
}

/// Pieces of initial contents read at once: at most this many bytes each.
pub const PIECE_BYTES: u64 = 64 << 20;
/// Threads reading pieces while the caller consumes them.
pub const READERS: usize = 4;

/// Wall time the consumer of `read_pieces` spent waiting for pieces and
/// consuming them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PieceTimes {
    /// Waiting for the readers.
    pub waiting: Duration,
    /// Inside the consumer (uploading).
    pub consuming: Duration,
}

impl InitialContents {
    /// Reads every initial tensor in pieces of at most `piece_bytes` on
    /// `readers` threads and hands each piece to `consume` on this thread, in
    /// any order, at most `readers + 1` pieces held at once. The first error
    /// (a read's or `consume`'s) stops the reading and is returned.
    pub fn read_pieces<F>(
        &self,
        piece_bytes: u64,
        readers: usize,
        mut consume: F,
    ) -> Result<PieceTimes, ReplayError>
    where
        F: FnMut(Piece<'_>, &[u8]) -> Result<(), ReplayError>,
    {
        let mut times = PieceTimes::default();
        let piece_bytes = piece_bytes.max(1);
        let pieces: Vec<Piece<'_>> = (self.uploads.iter())
            .flat_map(|upload| {
                (0..upload.len)
                    .step_by(piece_bytes as usize)
                    .map(move |offset| Piece { upload, offset })
            })
            .collect();
        if pieces.is_empty() {
            return Ok(times);
        }
        let file = File::open(&self.path).map_err(|source| ReplayError::Io {
            path: self.path.clone(),
            source,
        })?;
        let readers = readers.clamp(1, pieces.len());
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
        for _ in 0..=readers {
            free_tx.send(Vec::new()).expect("the receiver lives here");
        }
        let free_rx = Mutex::new(free_rx);
        let (full_tx, full_rx) = mpsc::channel::<Result<(usize, Vec<u8>), ReplayError>>();
        thread::scope(|scope| {
            for _ in 0..readers {
                let full_tx = full_tx.clone();
                let (file, pieces, next, stop, free_rx) = (&file, &pieces, &next, &stop, &free_rx);
                let path = &self.path;
                scope.spawn(move || loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= pieces.len() || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(mut bytes) = free_rx.lock().expect("no reader panics").recv() else {
                        return;
                    };
                    let piece = pieces[index];
                    let len = (piece.upload.len - piece.offset).min(piece_bytes) as usize;
                    bytes.resize(len, 0);
                    let read = file
                        .read_exact_at(&mut bytes, piece.upload.file_offset + piece.offset)
                        .map(|()| (index, bytes))
                        .map_err(|source| ReplayError::Io {
                            path: path.clone(),
                            source,
                        });
                    if full_tx.send(read).is_err() {
                        return;
                    }
                });
            }
            drop(full_tx);
            let mut result = Ok(());
            for _ in 0..pieces.len() {
                let waited = Instant::now();
                let Ok(read) = full_rx.recv() else { break };
                times.waiting += waited.elapsed();
                let consumed = Instant::now();
                let done = read.and_then(|(index, bytes)| {
                    let done = consume(pieces[index], &bytes);
                    // The readers may have ended; the buffer is then dropped.
                    let _ = free_tx.send(bytes);
                    done
                });
                times.consuming += consumed.elapsed();
                if let Err(error) = done {
                    result = Err(error);
                    break;
                }
            }
            // Stop the readers: none takes another piece, and a reader waiting
            // for a free buffer sees the channel closed.
            stop.store(true, Ordering::Relaxed);
            drop(free_tx);
            drop(full_rx);
            result
        })?;
        Ok(times)
    }
}

/// Reads tensors' bytes out of `buffers.safetensors`.
#[derive(Debug)]
pub struct TensorReader {
    file: File,
    path: PathBuf,
}

impl TensorReader {
    /// Reads `upload`'s bytes into `into` (resized to fit).
    pub fn read(&mut self, upload: &InitialUpload, into: &mut Vec<u8>) -> Result<(), ReplayError> {
        let io = |source| ReplayError::Io {
            path: self.path.clone(),
            source,
        };
        let len = usize::try_from(upload.len).map_err(|_| ReplayError::CorruptTensors {
            path: self.path.clone(),
            reason: format!("a tensor of {} bytes does not fit in memory", upload.len),
        })?;
        into.resize(len, 0);
        self.file
            .seek(SeekFrom::Start(upload.file_offset))
            .map_err(io)?;
        self.file.read_exact(into).map_err(io)
    }
}

fn locate_one(
    buffer: &Buffer,
    header: &Metadata,
    data_start: u64,
) -> Result<InitialUpload, ReplayError> {
    let tensor = &buffer.initial_tensor;
    let Some(info) = header.info(tensor) else {
        return Err(ReplayError::InitialTensorMissing {
            buffer: buffer.name.clone(),
            tensor: tensor.clone(),
        });
    };
    let dtype = DType::try_from(buffer.dtype).unwrap_or_default();
    if safetensors_dtype(dtype) != Some(info.dtype) {
        return Err(ReplayError::InitialTensorDtype {
            buffer: buffer.name.clone(),
            expected: dtype.as_str_name(),
            found: format!("{:?}", info.dtype),
        });
    }
    let found: Vec<u64> = info.shape.iter().map(|&dim| dim as u64).collect();
    if found != buffer.shape {
        return Err(ReplayError::InitialTensorShape {
            buffer: buffer.name.clone(),
            expected: buffer.shape.clone(),
            found,
        });
    }
    let (start, end) = info.data_offsets;
    // The header was validated against the file's length, so these fit.
    Ok(InitialUpload {
        buffer: 0,
        file_offset: data_start + start as u64,
        len: (end - start) as u64,
    })
}

/// Reads and validates the header; returns where the data starts and the
/// tensors' metadata. The file's length must be exactly what the header
/// describes.
fn read_header(path: &Path) -> Result<(u64, Metadata), ReplayError> {
    let io = |source| ReplayError::Io {
        path: path.to_owned(),
        source,
    };
    let corrupt = |reason: String| ReplayError::CorruptTensors {
        path: path.to_owned(),
        reason,
    };
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut len_bytes = [0u8; HEADER_LEN_BYTES as usize];
    match file.read_exact(&mut len_bytes) {
        Ok(()) => {}
        Err(err) if err.kind() == ErrorKind::UnexpectedEof => {
            return Err(corrupt("shorter than its 8-byte header length".to_owned()));
        }
        Err(err) => return Err(io(err)),
    }
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(corrupt(format!(
            "a header of {header_len} bytes exceeds the format's {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    let data_start = HEADER_LEN_BYTES + header_len;
    if data_start > file_len {
        return Err(corrupt(format!(
            "truncated: the header needs {data_start} bytes, the file holds {file_len}"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let metadata: Metadata =
        serde_json::from_slice(&header).map_err(|err| corrupt(format!("header: {err}")))?;
    let data_len = metadata.data_len() as u64;
    if data_start.checked_add(data_len) != Some(file_len) {
        return Err(corrupt(format!(
            "the header describes {data_len} data bytes, the file holds {}",
            file_len - data_start
        )));
    }
    Ok((data_start, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_views_are_contiguous() {
        assert!(is_contiguous(&[4, 3, 2], &[6, 2, 1]));
        assert!(is_contiguous(&[5], &[1]));
        assert!(is_contiguous(&[], &[]));
    }

    #[test]
    fn size_one_dimensions_may_have_any_stride() {
        assert!(is_contiguous(&[1, 3], &[99, 1]));
        assert!(is_contiguous(&[3, 1], &[1, 7]));
    }

    #[test]
    fn empty_views_are_contiguous() {
        assert!(is_contiguous(&[0, 3], &[0, 0]));
    }

    #[test]
    fn transposed_padded_or_broadcast_views_are_not() {
        assert!(!is_contiguous(&[3, 2], &[1, 3]));
        assert!(!is_contiguous(&[3, 2], &[4, 1]));
        assert!(!is_contiguous(&[3, 2], &[0, 1]));
        assert!(!is_contiguous(&[3, 2], &[2]));
    }

    #[test]
    fn every_manifest_dtype_has_a_safetensors_dtype() {
        for value in 1.. {
            let Ok(dtype) = DType::try_from(value) else {
                break;
            };
            assert!(safetensors_dtype(dtype).is_some(), "{dtype:?}");
        }
    }
}
