//! Runs `flare inspect` on manifests written by the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use helios::core::prost::Message;
use helios::core::proto::Core;
use helios::core::sample::tiny_core;

/// A fresh, empty core directory under Cargo's temporary directory for
/// integration tests.
fn core_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("inspect-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_core(name: &str, core: &Core) -> PathBuf {
    let dir = core_dir(name);
    std::fs::write(dir.join("manifest.pb"), core.encode_to_vec()).unwrap();
    dir
}

fn inspect(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flare"))
        .arg("inspect")
        .arg(dir)
        .output()
        .expect("the flare binary runs")
}

#[test]
fn inspect_prints_a_valid_core() {
    let dir = write_core("valid", &tiny_core());
    let out = inspect(&dir);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("decode_capacities     [1, 2, 4]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("prefill_capacities    [128, 256]"),
        "{stdout}"
    );
    assert!(stdout.contains("capacities [1, 2, 4]"), "{stdout}");
    assert!(stdout.contains("recipe                sample"), "{stdout}");
}

#[test]
fn inspect_rejects_an_invalid_core_with_status_2() {
    let mut core = tiny_core();
    core.abi_version = 2;
    let dir = write_core("newer-abi", &core);
    let out = inspect(&dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("flare: error:"), "{stderr}");
}

#[test]
fn inspect_rejects_a_directory_without_manifest() {
    let dir = core_dir("empty");
    let out = inspect(&dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

#[test]
fn inspect_lists_the_ranks_of_a_tensor_parallel_core() {
    let core = helios::core::sample::ranked_core(2);
    let peer_base = core.rank_layout.as_ref().unwrap().peers[0]
        .window
        .as_ref()
        .unwrap()
        .base;
    let dir = write_core("two-ranks", &core);
    let out = inspect(&dir);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("ranks         2 (tensor parallel"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("rank 1   window base {peer_base:#x}")),
        "{stdout}"
    );
    assert!(!inspect_one_rank_mentions_ranks());
}

fn inspect_one_rank_mentions_ranks() -> bool {
    let dir = write_core("one-rank", &tiny_core());
    String::from_utf8(inspect(&dir).stdout)
        .unwrap()
        .contains("ranks ")
}
