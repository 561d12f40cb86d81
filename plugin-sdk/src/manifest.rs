//! The static manifest: what a plugin is, written at compile time into a read-only section
//! of the library, so the router (`switchyard plugin inspect`) can read it from the file
//! without loading the library and running any of its code.
//!
//! Format (also written by the C and C++ macros in `plugin.h`): the ELF section
//! [`SECTION`] holds NUL-terminated text records; the linker may concatenate records from
//! several objects and pad between them with NULs. Each record is lines of `key value`:
//!
//! ```text
//! switchyard-manifest 1
//! abi 1.0
//! fingerprint 2742308371954690034
//! sdk 0.1.0
//! name acme-least-busy
//! version 1.2.0
//! vendor Acme Corp
//! ```
//! ```text
//! switchyard-type 1
//! kind scorer
//! name acme.least-busy
//! inputs 2 | 4
//! ```
//!
//! One `switchyard-manifest` record per library; one `switchyard-type` record per type
//! the library declares (optional: a library that declares none is compared on its
//! identity only). `inputs` is the input-group mask as C writes it: integers joined by `|`.
//! Readers ignore keys they do not know.

use crate::abi::{SWITCHYARD_ABI_MAJOR, SWITCHYARD_ABI_MINOR, SWITCHYARD_LAYOUT_FINGERPRINT};

/// The name of the section that holds the manifest.
pub const SECTION: &str = ".switchyard_manifest";
/// First line of the library's record.
pub const MANIFEST_HEADER: &str = "switchyard-manifest 1";
/// First line of a type record.
pub const TYPE_HEADER: &str = "switchyard-type 1";

/// One type the library registers, as declared in `export_plugin!`'s `types: [...]`.
#[derive(Clone, Copy, Debug)]
pub struct TypeDecl {
    /// `filter`, `scorer`, `picker` or `policy`.
    pub kind: &'static str,
    pub name: &'static str,
    /// `WorkerInputs` bits; 0 for a policy type.
    pub inputs: u32,
}

#[doc(hidden)]
#[allow(non_upper_case_globals)]
pub mod kind {
    pub const filter: &str = "filter";
    pub const scorer: &str = "scorer";
    pub const picker: &str = "picker";
    pub const admitter: &str = "admitter";
    pub const policy: &str = "policy";
}

/// Copies `text` to `out` at `at` (or only counts, when `out` is empty); returns the end.
const fn put(out: &mut [u8], at: usize, text: &[u8]) -> usize {
    if !out.is_empty() {
        let mut i = 0;
        while i < text.len() {
            out[at + i] = text[i];
            i += 1;
        }
    }
    at + text.len()
}

const fn put_number(out: &mut [u8], at: usize, mut value: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = digits.len();
    loop {
        n -= 1;
        digits[n] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    let mut at = at;
    while n < digits.len() {
        at = put(out, at, &[digits[n]]);
        n += 1;
    }
    at
}

const fn put_line(out: &mut [u8], at: usize, key: &str, value: &str) -> usize {
    let at = put(out, at, key.as_bytes());
    let at = put(out, at, b" ");
    let at = put(out, at, value.as_bytes());
    put(out, at, b"\n")
}

/// Writes the whole manifest (or counts its bytes, when `out` is empty).
const fn write(
    out: &mut [u8],
    name: &str,
    version: &str,
    vendor: &str,
    types: &[TypeDecl],
) -> usize {
    let mut at = put(out, 0, MANIFEST_HEADER.as_bytes());
    at = put(out, at, b"\nabi ");
    at = put_number(out, at, SWITCHYARD_ABI_MAJOR as u64);
    at = put(out, at, b".");
    at = put_number(out, at, SWITCHYARD_ABI_MINOR as u64);
    at = put(out, at, b"\nfingerprint ");
    at = put_number(out, at, SWITCHYARD_LAYOUT_FINGERPRINT);
    at = put(out, at, b"\n");
    at = put_line(out, at, "sdk", env!("CARGO_PKG_VERSION"));
    at = put_line(out, at, "name", name);
    at = put_line(out, at, "version", version);
    at = put_line(out, at, "vendor", vendor);
    at = put(out, at, b"\0");
    let mut i = 0;
    while i < types.len() {
        at = put(out, at, TYPE_HEADER.as_bytes());
        at = put(out, at, b"\n");
        at = put_line(out, at, "kind", types[i].kind);
        at = put_line(out, at, "name", types[i].name);
        at = put(out, at, b"inputs ");
        at = put_number(out, at, types[i].inputs as u64);
        at = put(out, at, b"\n\0");
        i += 1;
    }
    at
}

/// The manifest's length in bytes; the array length for [`build`].
pub const fn len(name: &str, version: &str, vendor: &str, types: &[TypeDecl]) -> usize {
    write(&mut [], name, version, vendor, types)
}

/// The manifest's bytes. `N` must be [`len`] of the same arguments.
pub const fn build<const N: usize>(
    name: &str,
    version: &str,
    vendor: &str,
    types: &[TypeDecl],
) -> [u8; N] {
    let mut out = [0u8; N];
    let end = write(&mut out, name, version, vendor, types);
    assert!(end == N, "manifest length differs from manifest::len");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_documented_records() {
        const TYPES: &[TypeDecl] = &[TypeDecl {
            kind: kind::scorer,
            name: "acme.least-busy",
            inputs: 6,
        }];
        const LEN: usize = len("acme", "1.2.0", "Acme Corp", TYPES);
        static BYTES: [u8; LEN] = build::<LEN>("acme", "1.2.0", "Acme Corp", TYPES);
        let text = std::str::from_utf8(&BYTES).unwrap();
        assert_eq!(
            text,
            format!(
                "switchyard-manifest 1\nabi {SWITCHYARD_ABI_MAJOR}.{SWITCHYARD_ABI_MINOR}\n\
                 fingerprint {SWITCHYARD_LAYOUT_FINGERPRINT}\nsdk {}\nname acme\n\
                 version 1.2.0\nvendor Acme Corp\n\0\
                 switchyard-type 1\nkind scorer\nname acme.least-busy\ninputs 6\n\0",
                env!("CARGO_PKG_VERSION")
            )
        );
    }
}
