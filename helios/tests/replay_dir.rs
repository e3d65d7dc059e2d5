//! Reading core directories: every file agrees with the manifest, or the
//! exact typed error says which does not, before any CUDA work.

mod support;

use std::io::ErrorKind;
use std::path::Path;

use helios::core::proto::Core;
use helios::core::sample::tiny_core;
use helios::core::CoreError;
use helios::replay::{
    check_core, image_path, isolate_core, CheckOptions, CoreDir, KvBacking, LoadOptions,
    LoadedCore, ReplayError, BUFFERS_FILE,
};
use safetensors::Dtype;
use support::{fresh_dir, give_initial, use_image, write_core, Tensor};

const IMAGE: &[u8] = b"not a cubin: bytes the loader only hashes on the host";

/// The sample core with a real image digest and two buffers with initial
/// contents, and the tensors that hold them.
fn sample() -> (Core, Vec<Tensor>) {
    let mut core = tiny_core();
    use_image(&mut core, IMAGE);
    give_initial(&mut core, "weight.embed", "weight.embed");
    give_initial(&mut core, "state.stop_tokens", "stop");
    let tensors = vec![
        Tensor::counting("weight.embed", Dtype::BF16, &[256, 64], 7),
        Tensor::counting("stop", Dtype::I32, &[4, 4], 1),
    ];
    (core, tensors)
}

fn written(name: &str, core: &Core, tensors: &[Tensor], images: &[&[u8]]) -> std::path::PathBuf {
    let dir = fresh_dir(&format!("replay-dir-{name}"));
    write_core(&dir, core, tensors, images);
    dir
}

fn read_err(dir: &Path) -> ReplayError {
    match CoreDir::read(dir) {
        Ok(_) => panic!("the core directory was accepted"),
        Err(err) => err,
    }
}

#[test]
fn a_complete_core_dir_reads() {
    let (core, tensors) = sample();
    let dir = written("complete", &core, &tensors, &[IMAGE]);
    let read = CoreDir::read(&dir).unwrap();
    assert_eq!(read.images().len(), 1);
    assert_eq!(read.images()[0].bytes, IMAGE);
    assert_eq!(read.images()[0].sha256, core.images[0].sha256);

    let initial = &read.initial()[0];
    assert_eq!(initial.uploads().len(), 2);
    assert_eq!(initial.bytes(), 256 * 64 * 2 + 4 * 4 * 4);
    let mut reader = initial.reader().unwrap();
    let mut bytes = Vec::new();
    for upload in initial.uploads() {
        let buffer = &read.core().buffers()[upload.buffer];
        let tensor = tensors
            .iter()
            .find(|t| t.name == buffer.initial_tensor)
            .unwrap();
        reader.read(upload, &mut bytes).unwrap();
        assert_eq!(bytes, tensor.data, "{}", buffer.name);
    }
}

#[test]
fn pieces_read_by_several_threads_reassemble_every_tensor() {
    let (core, tensors) = sample();
    let dir = written("pieces", &core, &tensors, &[IMAGE]);
    let read = CoreDir::read(&dir).unwrap();
    let initial = &read.initial()[0];
    for (piece_bytes, readers) in [(7, 3), (1000, 1), (1 << 20, 4)] {
        let mut rebuilt: Vec<Vec<u8>> = initial
            .uploads()
            .iter()
            .map(|upload| vec![0xAA; upload.len as usize])
            .collect();
        let mut seen = 0u64;
        initial
            .read_pieces(piece_bytes, readers, |piece, bytes| {
                let at = initial.uploads().iter().position(|u| u == piece.upload);
                let start = piece.offset as usize;
                rebuilt[at.unwrap()][start..start + bytes.len()].copy_from_slice(bytes);
                assert!(bytes.len() as u64 <= piece_bytes);
                seen += bytes.len() as u64;
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, initial.bytes(), "every byte once at {piece_bytes}");
        let mut reader = initial.reader().unwrap();
        let mut whole = Vec::new();
        for (upload, bytes) in initial.uploads().iter().zip(&rebuilt) {
            reader.read(upload, &mut whole).unwrap();
            assert_eq!(
                bytes, &whole,
                "pieces of {piece_bytes} on {readers} threads"
            );
        }
    }
}

#[test]
fn every_rank_of_a_tensor_parallel_core_has_its_initial_contents_located() {
    // A peer's buffers name their tensors under `rank1/`, as Ignition's merge
    // stores a peer's shards; each rank's contents are located on its own.
    let (core, mut tensors) = sample();
    let mut core = helios::core::sample::with_ranks(core, 2);
    let peer = &mut core.rank_layout.as_mut().unwrap().peers[0];
    for buffer in &mut peer.buffers {
        if !buffer.initial_tensor.is_empty() {
            buffer.initial_tensor = format!("rank1/{}", buffer.initial_tensor);
        }
    }
    let peer_tensors: Vec<Tensor> = (tensors.iter())
        .map(|tensor| {
            Tensor::counting(
                &format!("rank1/{}", tensor.name),
                tensor.dtype,
                &tensor.shape,
                11,
            )
        })
        .collect();
    tensors.extend(peer_tensors.iter().cloned());
    let dir = written("two-ranks", &core, &tensors, &[IMAGE]);
    let read = CoreDir::read(&dir).unwrap();
    let initial = read.initial();
    assert_eq!(initial.len(), 2);
    for (rank, wanted) in [(0, &tensors[..2]), (1, &peer_tensors[..])] {
        let mut reader = initial[rank].reader().unwrap();
        let mut bytes = Vec::new();
        let mut found = Vec::new();
        for upload in initial[rank].uploads() {
            reader.read(upload, &mut bytes).unwrap();
            found.push(bytes.clone());
        }
        let expected: Vec<Vec<u8>> = wanted.iter().map(|tensor| tensor.data.clone()).collect();
        assert_eq!(found, expected, "rank {rank}");
    }
    // A peer's tensor missing from the file is named.
    tensors.truncate(3);
    let dir = written("two-ranks-missing", &core, &tensors, &[IMAGE]);
    assert!(
        matches!(read_err(&dir), ReplayError::InitialTensorMissing { ref tensor, .. } if tensor == "rank1/stop"),
    );
}

#[test]
fn a_failed_piece_stops_the_reading_with_its_error() {
    let (core, tensors) = sample();
    let dir = written("pieces-fail", &core, &tensors, &[IMAGE]);
    let read = CoreDir::read(&dir).unwrap();
    let mut consumed = 0;
    let err = read.initial()[0]
        .read_pieces(16, 3, |_, _| {
            consumed += 1;
            if consumed == 5 {
                return Err(ReplayError::NonContiguous {
                    buffer: "the fifth piece".to_owned(),
                });
            }
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(err, ReplayError::NonContiguous { ref buffer } if buffer == "the fifth piece")
    );
    assert_eq!(consumed, 5, "no piece is consumed after the error");
    // A file cut short after it was checked: the read's own error.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(BUFFERS_FILE))
        .unwrap();
    file.set_len(64).unwrap();
    let err = read.initial()[0]
        .read_pieces(16, 2, |_, _| Ok(()))
        .unwrap_err();
    assert!(
        matches!(err, ReplayError::Io { ref source, .. } if source.kind() == ErrorKind::UnexpectedEof),
        "{err}"
    );
}

#[test]
fn the_committed_fixture_reads() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let read = CoreDir::read(&fixture).unwrap();
    assert!(read.images().is_empty());
    assert!(!read.initial()[0].uploads().is_empty());
    let mut reader = read.initial()[0].reader().unwrap();
    let mut bytes = Vec::new();
    for upload in read.initial()[0].uploads() {
        reader.read(upload, &mut bytes).unwrap();
        let buffer = &read.core().buffers()[upload.buffer];
        assert_eq!(bytes.len() as u64, buffer.size_bytes, "{}", buffer.name);
    }
}

#[test]
fn a_core_without_initial_contents_needs_no_tensor_file() {
    let mut core = tiny_core();
    use_image(&mut core, IMAGE);
    let dir = written("no-initial", &core, &[], &[IMAGE]);
    let read = CoreDir::read(&dir).unwrap();
    assert!(read.initial()[0].uploads().is_empty());
}

#[test]
fn a_missing_manifest_is_a_core_io_error() {
    let dir = fresh_dir("replay-dir-no-manifest");
    assert!(matches!(
        read_err(&dir),
        ReplayError::Core(CoreError::Io { .. })
    ));
}

#[test]
fn a_corrupt_manifest_is_a_decode_error() {
    let dir = fresh_dir("replay-dir-corrupt-manifest");
    std::fs::write(dir.join("manifest.pb"), b"\xff\xff\xff").unwrap();
    assert!(matches!(
        read_err(&dir),
        ReplayError::Core(CoreError::Decode(_))
    ));
}

#[test]
fn a_missing_image_file_names_its_path() {
    let (core, tensors) = sample();
    let dir = written("no-image", &core, &tensors, &[]);
    let expected = image_path(&dir, &core.images[0].sha256);
    match read_err(&dir) {
        ReplayError::Io { path, source } => {
            assert_eq!(path, expected);
            assert_eq!(source.kind(), ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn an_image_whose_bytes_do_not_hash_to_its_name_is_refused() {
    let (core, tensors) = sample();
    let dir = written("bad-digest", &core, &tensors, &[]);
    let mut forged = IMAGE.to_vec();
    forged[0] ^= 1;
    let path = image_path(&dir, &core.images[0].sha256);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, forged).unwrap();
    assert!(matches!(
        read_err(&dir),
        ReplayError::ImageDigest { ref sha256, .. } if *sha256 == core.images[0].sha256
    ));
}

#[test]
fn an_image_of_another_size_is_refused() {
    let (mut core, tensors) = sample();
    core.images[0].size_bytes += 1;
    let dir = written("bad-size", &core, &tensors, &[IMAGE]);
    assert!(matches!(
        read_err(&dir),
        ReplayError::ImageSize { declared, found, .. }
            if declared == IMAGE.len() as u64 + 1 && found == IMAGE.len() as u64
    ));
}

#[test]
fn a_missing_initial_tensor_names_buffer_and_tensor() {
    let (core, mut tensors) = sample();
    tensors.retain(|t| t.name != "stop");
    let dir = written("no-tensor", &core, &tensors, &[IMAGE]);
    assert!(matches!(
        read_err(&dir),
        ReplayError::InitialTensorMissing { ref buffer, ref tensor }
            if buffer == "state.stop_tokens" && tensor == "stop"
    ));
}

#[test]
fn an_initial_tensor_of_another_dtype_is_refused() {
    let (core, mut tensors) = sample();
    tensors[1] = Tensor::counting("stop", Dtype::F32, &[4, 4], 1);
    let dir = written("bad-dtype", &core, &tensors, &[IMAGE]);
    assert!(matches!(
        read_err(&dir),
        ReplayError::InitialTensorDtype { ref buffer, expected: "DTYPE_I32", ref found }
            if buffer == "state.stop_tokens" && found == "F32"
    ));
}

#[test]
fn an_initial_tensor_of_another_shape_is_refused() {
    let (core, mut tensors) = sample();
    tensors[0] = Tensor::counting("weight.embed", Dtype::BF16, &[64, 256], 7);
    let dir = written("bad-shape", &core, &tensors, &[IMAGE]);
    assert!(matches!(
        read_err(&dir),
        ReplayError::InitialTensorShape { ref buffer, ref expected, ref found }
            if buffer == "weight.embed" && *expected == [256, 64] && *found == [64, 256]
    ));
}

#[test]
fn a_strided_buffer_with_initial_contents_is_refused() {
    let (mut core, tensors) = sample();
    let embed = core
        .buffers
        .iter_mut()
        .find(|b| b.name == "weight.embed")
        .unwrap();
    embed.strides = vec![1, 256]; // the transposed view of the same bytes
    let dir = written("strided", &core, &tensors, &[IMAGE]);
    assert!(matches!(
        read_err(&dir),
        ReplayError::NonContiguous { ref buffer } if buffer == "weight.embed"
    ));
}

#[test]
fn a_missing_tensor_file_is_an_io_error() {
    let (core, _) = sample();
    let dir = written("no-tensor-file", &core, &[], &[IMAGE]);
    match read_err(&dir) {
        ReplayError::Io { path, source } => {
            assert_eq!(path, dir.join(BUFFERS_FILE));
            assert_eq!(source.kind(), ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn a_truncated_tensor_file_is_corrupt() {
    let (core, tensors) = sample();
    let dir = written("truncated", &core, &tensors, &[IMAGE]);
    let path = dir.join(BUFFERS_FILE);
    let bytes = std::fs::read(&path).unwrap();
    for keep in [0, 4, 12, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        assert!(
            matches!(read_err(&dir), ReplayError::CorruptTensors { .. }),
            "truncated to {keep} bytes"
        );
    }
}

#[test]
fn a_tensor_file_with_extra_bytes_is_corrupt() {
    let (core, tensors) = sample();
    let dir = written("extra-bytes", &core, &tensors, &[IMAGE]);
    let path = dir.join(BUFFERS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.push(0);
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(read_err(&dir), ReplayError::CorruptTensors { .. }));
}

#[test]
fn a_garbage_header_is_corrupt() {
    let (core, tensors) = sample();
    let dir = written("garbage-header", &core, &tensors, &[IMAGE]);
    let mut bytes = 8u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"not json");
    std::fs::write(dir.join(BUFFERS_FILE), bytes).unwrap();
    assert!(matches!(read_err(&dir), ReplayError::CorruptTensors { .. }));
    let huge = u64::MAX.to_le_bytes();
    std::fs::write(dir.join(BUFFERS_FILE), huge).unwrap();
    assert!(matches!(read_err(&dir), ReplayError::CorruptTensors { .. }));
}

#[test]
fn loading_reports_file_errors_before_any_cuda_work() {
    let (core, tensors) = sample();
    let dir = written("load-no-image", &core, &tensors, &[]);
    let err = LoadedCore::load(&dir, &LoadOptions::default()).unwrap_err();
    assert!(matches!(err, ReplayError::Io { .. }), "{err:?}");
}

#[test]
fn every_rank_at_once_loads_its_prepared_pages_and_names_one_device_per_rank() {
    // Its rank layout validates (tests/manifest.rs) and `flare replay` loads
    // every rank with its prepared pages (tests/gpu_replay.rs); KV pages sized
    // from free memory are one rank's (serving loads each rank on its thread),
    // so loading every rank at once with them is refused, typed, before any
    // CUDA work.
    let (core, tensors) = sample();
    let core = helios::core::sample::with_ranks(core, 2);
    let dir = written("load-two-ranks", &core, &tensors, &[IMAGE]);
    let sized = LoadOptions {
        kv: KvBacking::FromFreeMemory { reserve_bytes: 0 },
        ..LoadOptions::default()
    };
    let err = LoadedCore::load(&dir, &sized).unwrap_err();
    assert!(
        matches!(err, ReplayError::RanksFromFreeMemory { world_size: 2 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("drop --gpu-reserve"), "{err}");
    // Devices for the ranks name one per rank.
    let three = LoadOptions {
        rank_devices: vec![0, 1, 2],
        ..LoadOptions::default()
    };
    let err = LoadedCore::load(&dir, &three).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::RankDevices {
                given: 3,
                world_size: 2
            }
        ),
        "{err:?}"
    );
    // What runs one rank alone is refused before any rank loads.
    let bench = CheckOptions {
        bench_decode: Some((1, std::num::NonZeroU32::new(4).unwrap())),
        ..CheckOptions::qualification(0)
    };
    let err = check_core(&dir, &bench).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::OneRankOnly {
                what: "the decode bench",
                world_size: 2
            }
        ),
        "{err:?}"
    );
    let err = isolate_core(&dir, 0).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::OneRankOnly {
                what: "fault isolation",
                world_size: 2
            }
        ),
        "{err:?}"
    );
    // A rank past the world size, for a serving thread.
    let read = CoreDir::read(&dir).unwrap();
    let err = LoadedCore::load_rank(&read, 2, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::NoRank {
                rank: 2,
                world_size: 2
            }
        ),
        "{err:?}"
    );
    // Loading every rank, the rank that failed is named (here the first: no
    // device, or the sample's identity is no real device's); a serving
    // thread's one rank is named by its group, not again here.
    let err = LoadedCore::load(&dir, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(
            &err,
            ReplayError::Rank {
                rank: 0,
                world_size: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("rank 0 of 2: "), "{err}");
    let err = LoadedCore::load_rank(&read, 1, &LoadOptions::default()).unwrap_err();
    assert!(!matches!(err, ReplayError::Rank { .. }), "{err:?}");
}
