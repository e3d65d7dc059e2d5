//! Generates the Rust types of the runtime-core manifest from
//! `proto/flare_core.proto`.
//!
//! The schema is compiled by `protox`, a protobuf compiler written in Rust, so
//! no `protoc` binary is needed on any machine; `prost-build` turns the
//! resulting descriptor set into `$OUT_DIR/flare.core.v1.rs`.

use std::error::Error;

const PROTO_DIR: &str = "../proto";
const PROTO_FILE: &str = "../proto/flare_core.proto";

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_FILE}");
    println!("cargo:rerun-if-changed=build.rs");
    let descriptors = protox::compile([PROTO_FILE], [PROTO_DIR])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
