//! A plugin file is checked as an ELF shared library of this machine before `dlopen`
//! maps it: a file cut short makes the dynamic loader map past its end, and the router
//! dies of SIGBUS with no message. Everything `dlopen` would map or read first (the ELF
//! header, every program header and segment, the dynamic section, the dynamic symbol
//! table with the entry symbol) must lie inside the file.

use std::mem::size_of;
use std::path::Path;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, FileKind, Object, ObjectSymbol};
use switchyard_plugin_sdk::abi::{SWITCHYARD_ABI_MAJOR, SWITCHYARD_ENTRY_SYMBOL};

use super::load_error::LoadError;

/// The ELF machine this router runs on, when it is one this check knows.
fn host_machine() -> Option<(u16, &'static str)> {
    match std::env::consts::ARCH {
        "x86_64" => Some((elf::EM_X86_64, "x86-64")),
        "aarch64" => Some((elf::EM_AARCH64, "aarch64")),
        _ => None,
    }
}

/// The file is long enough for an ELF header and is 64-bit ELF.
fn is_elf64(data: &[u8]) -> Result<(), String> {
    if data.len() < size_of::<elf::FileHeader64<Endianness>>() {
        return Err(format!(
            "the file has {} bytes, too few for an ELF header: it is empty or was cut short",
            data.len()
        ));
    }
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => {}
        Ok(FileKind::Elf32) => return Err("it is a 32-bit ELF file; this router is 64-bit".into()),
        Ok(other) => return Err(format!("it is a {other:?} file, not an ELF shared library")),
        Err(_) => return Err("it does not start with the ELF magic bytes".into()),
    }
    Ok(())
}

/// The bytes of an ELF header: what `check_header` needs of a file, read before the rest.
pub const HEADER_BYTES: usize = size_of::<elf::FileHeader64<Endianness>>();

/// Checks the ELF header at the start of the plugin file at `path` (at least its first
/// `HEADER_BYTES`, or the whole file if shorter): 64-bit ELF, a shared object, for this
/// machine. A file that is none of these is refused before the rest of it is read.
pub fn check_header(path: &Path, data: &[u8]) -> Result<(), LoadError> {
    let bad = |reason: String| LoadError::NotLoadable {
        path: path.to_owned(),
        reason,
    };
    is_elf64(data).map_err(bad)?;
    let header = elf::FileHeader64::<Endianness>::parse(data).map_err(|e| unreadable(path, e))?;
    let endian = header.endian().map_err(|e| unreadable(path, e))?;
    let kind = header.e_type(endian);
    if kind != elf::ET_DYN {
        return Err(bad(format!(
            "its ELF type is {kind}, not a shared object ({}): build a cdylib (Rust) or a MODULE/SHARED library (C, C++)",
            elf::ET_DYN
        )));
    }
    if let Some((machine, name)) = host_machine() {
        let found = header.e_machine(endian);
        if found != machine {
            return Err(bad(format!(
                "it is built for ELF machine {found}, this router runs on {name} ({machine}): build the plugin for this platform"
            )));
        }
    }
    Ok(())
}

fn unreadable(path: &Path, e: object::read::Error) -> LoadError {
    LoadError::NotLoadable {
        path: path.to_owned(),
        reason: format!("its ELF header is unreadable ({e}): the file was cut short or corrupted"),
    }
}

/// Checks the bytes of the plugin file at `path` (what is about to be loaded).
pub fn check(path: &Path, data: &[u8]) -> Result<(), LoadError> {
    let bad = |reason: String| LoadError::NotLoadable {
        path: path.to_owned(),
        reason,
    };
    check_header(path, data)?;
    let header = elf::FileHeader64::<Endianness>::parse(data).map_err(|e| unreadable(path, e))?;
    let endian = header.endian().map_err(|e| unreadable(path, e))?;
    let len = data.len() as u64;
    let segments = header.program_headers(endian, data).map_err(|_| {
        bad(format!(
            "its program headers lie past the end of the file ({len} bytes): the file was cut short or corrupted"
        ))
    })?;
    let mut dynamic = false;
    for (i, segment) in segments.iter().enumerate() {
        let (offset, size) = (segment.p_offset(endian), segment.p_filesz(endian));
        if offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(bad(format!(
                "segment {i} (bytes {offset}..{}) lies past the end of the file ({len} bytes): the file was cut short or corrupted",
                offset.saturating_add(size)
            )));
        }
        dynamic |= segment.p_type(endian) == elf::PT_DYNAMIC;
    }
    if !dynamic {
        return Err(bad(
            "it has no dynamic section, so it is not a shared library".into(),
        ));
    }
    let file = ElfFile64::<Endianness>::parse(data).map_err(|e| {
        bad(format!(
            "its sections are unreadable ({e}): the file was cut short or corrupted"
        ))
    })?;
    let exported = |name: &str| {
        file.dynamic_symbols()
            .any(|s| s.is_definition() && s.name() == Ok(name))
    };
    if exported(SWITCHYARD_ENTRY_SYMBOL) {
        return Ok(());
    }
    let other_major = (0..=32u16)
        .filter(|&m| m != SWITCHYARD_ABI_MAJOR)
        .find(|m| exported(&format!("switchyard_plugin_entry_v{m}")));
    Err(LoadError::MissingEntry {
        path: path.to_owned(),
        other_major,
    })
}
