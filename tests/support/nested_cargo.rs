//! Cargo run from inside a test or a bench (the benches that build the Envoy module
//! include this file by path).
#![allow(dead_code)]

/// Cargo, for a build from inside a test or bench, without the variables cargo sets for
/// the running test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). Build scripts watch some
/// of them (ring's reruns when `CARGO_MANIFEST_DIR` changes), so a build that shares the
/// workspace's target folder would rebuild ring and everything above it, and the next
/// build outside a test would rebuild it all back: about 25 s a time in debug, the whole
/// tree in release.
pub fn nested_cargo() -> std::process::Command {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_the_test = matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        ) || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_");
        if set_for_the_test {
            cargo.env_remove(name);
        }
    }
    cargo
}
