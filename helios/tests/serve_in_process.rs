//! The in-process server's startup refuses what it cannot serve before
//! anything listens (no GPU needed for these refusals).

use std::path::PathBuf;

use helios::serve::{start_in_process, InProcessConfig, ServeError};

fn fixture_manifest() -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    std::fs::read(dir.join("manifest.pb")).unwrap()
}

fn config() -> InProcessConfig {
    InProcessConfig {
        host: "127.0.0.1".to_owned(),
        port: 0,
        api_key: None,
        model: "tiny".to_owned(),
        max_body_bytes: 1 << 20,
        queue_capacity: 8,
        device: 0,
        prefix_cache: true,
    }
}

#[test]
fn a_manifest_that_does_not_decode_is_refused() {
    // SAFETY: no handle is ever used: the manifest is refused first.
    let error =
        unsafe { start_in_process(b"not a manifest".to_vec(), vec![1], config()) }.unwrap_err();
    assert!(matches!(error, ServeError::Core(_)), "{error}");
}

#[test]
fn handles_that_do_not_match_the_graphs_fail_the_handoff() {
    // SAFETY: the handle count is checked before any handle is used.
    let error = unsafe { start_in_process(fixture_manifest(), vec![1, 2], config()) }.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, ServeError::Start(_)), "{text}");
    assert!(text.contains("graph handles"), "{text}");
}
