//! Runs the built `flare` binary and checks its exit statuses.

use std::process::Command;

fn flare(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flare"))
        .args(args)
        .output()
        .expect("the flare binary runs")
}

#[test]
fn version_reports_the_workspace_version() {
    let out = flare(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!("flare {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn subcommands_exit_with_status_2_when_the_core_cannot_be_loaded() {
    for args in [
        &["run", "tiny.core"][..],
        &["inspect", "tiny.core"][..],
        &["replay", "tiny.core", "--check"][..],
    ] {
        let out = flare(args);
        assert_eq!(out.status.code(), Some(2), "flare {args:?}");
        assert!(out.stdout.is_empty(), "flare {args:?}");
    }
}
