//! The committed C header is generated from src/abi.rs; this test fails when they drift.
//! Regenerate with `SWITCHYARD_BLESS=1 cargo test -p switchyard-plugin-sdk --test header`.

use std::path::PathBuf;

fn generate() -> String {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    // cbindgen cannot read a string constant built with env!, so the generator writes the
    // revision macro from the crate version itself: one source for both.
    config.after_includes = Some(format!(
        "\n/* Revision of the SDK this header belongs to (the crate version). */\n\
         #define SWITCHYARD_SDK_REVISION \"{}\"",
        env!("CARGO_PKG_VERSION")
    ));
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/abi.rs"))
        // ABI 1.5's additions, a file of the `abi` module of their own (file size).
        .with_src(crate_dir.join("src/abi/v1_5.rs"))
        .generate()
        .expect("cbindgen failed on src/abi.rs")
        .write(&mut out);
    String::from_utf8(out).expect("header is UTF-8")
}

#[test]
fn committed_header_matches_generated() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include/switchyard/plugin.h");
    let generated = generate();
    if std::env::var_os("SWITCHYARD_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()))
            + 1;
        panic!(
            "{} differs from what src/abi.rs generates (first difference at line {line}).\n\
             Regenerate it with: SWITCHYARD_BLESS=1 cargo test -p switchyard-plugin-sdk --test header",
            path.display()
        );
    }
}

#[test]
fn header_version_macros_match_cargo_toml() {
    let header = generate();
    let revision = format!(
        "#define SWITCHYARD_SDK_REVISION \"{}\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(header.contains(&revision), "header lacks `{revision}`: bump SWITCHYARD_SDK_REVISION in src/abi.rs to the crate version");
    assert_eq!(
        switchyard_plugin_sdk::abi::SWITCHYARD_SDK_REVISION,
        env!("CARGO_PKG_VERSION")
    );
    let major: u16 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: u16 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    // 0.x crates carry ABI 1.minor; from 1.0 on the crate major is the ABI major.
    if major > 0 {
        assert_eq!(major, switchyard_plugin_sdk::abi::SWITCHYARD_ABI_MAJOR);
    }
    let _ = minor;
}
