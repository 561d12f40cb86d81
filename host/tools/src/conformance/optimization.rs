//! Whether a plugin library looks built without optimization, read from its machine code:
//! a library carries no record of its compiler flags unless built with debug info, and an
//! unoptimized one costs ten times the time per call (a C++ scorer built as CMake leaves
//! an empty build type: 107.6 us against 9.6 us in Release).
//!
//! Unoptimized code (`-O0`, Cargo's debug profile) stores its arguments to the stack on
//! entry to nearly every function, so that a debugger can read them there; optimized code
//! keeps them in registers. Measured on the example plugins: 92-99 % of the functions of
//! a `-O0` C or C++ build store an argument register in their first 24 bytes, about half
//! of a Rust debug build's (the other half is the standard library's, built optimized),
//! and 4-14 % of `-O1` to `-O3` and release builds. x86-64 only: elsewhere nothing is said.

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

/// How many of a library's functions store an argument to the stack on entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgumentSpills {
    pub functions: usize,
    pub spilling: usize,
}

impl ArgumentSpills {
    /// Whether the share points at an unoptimized build: most functions spill (a C or C++
    /// library), or a third of many (a Rust debug build, the standard library's optimized
    /// functions among them).
    pub fn unoptimized(&self) -> bool {
        let (n, s) = (self.functions, self.spilling);
        (n >= 4 && s * 4 >= n * 3) || (n >= 100 && s * 3 >= n)
    }
}

/// The C runtime's own functions, the same in every build.
const RUNTIME: [&str; 6] = [
    "deregister_tm_clones",
    "register_tm_clones",
    "__do_global_dtors_aux",
    "frame_dummy",
    "_init",
    "_fini",
];

/// Bytes of a function's start looked at.
const ENTRY_BYTES: usize = 24;

/// The library's functions and how many spill, or `None` when it cannot be read so or is
/// not x86-64 (nothing to say).
pub fn argument_spills(data: &[u8]) -> Option<ArgumentSpills> {
    let file = object::File::parse(data).ok()?;
    if file.architecture() != object::Architecture::X86_64 {
        return None;
    }
    let symbols: Vec<_> = if file.symbols().next().is_some() {
        file.symbols().collect()
    } else {
        file.dynamic_symbols().collect()
    };
    let mut counted = ArgumentSpills {
        functions: 0,
        spilling: 0,
    };
    for symbol in symbols {
        if symbol.kind() != SymbolKind::Text || symbol.is_undefined() || symbol.size() < 8 {
            continue;
        }
        if RUNTIME.contains(&symbol.name().unwrap_or_default()) {
            continue;
        }
        let Some(index) = symbol.section_index() else {
            continue;
        };
        let Ok(section) = file.section_by_index(index) else {
            continue;
        };
        let length = symbol.size().min(ENTRY_BYTES as u64);
        let Ok(Some(entry)) = section.data_range(symbol.address(), length) else {
            continue;
        };
        counted.functions += 1;
        counted.spilling += usize::from(stores_an_argument(entry));
    }
    Some(counted)
}

/// Whether `code` holds a `mov` (opcode 0x89, 32- or 64-bit) of `rdi`, `rsi`, `rdx` or
/// `rcx` (the first four argument registers) to `[rbp - disp]` or `[rsp + disp]`. Read as
/// bytes, not decoded: a false match inside another instruction is possible, and the
/// share over all functions, not one function, is what counts.
fn stores_an_argument(code: &[u8]) -> bool {
    code.windows(3).any(|w| {
        let (opcode, modrm, sib) = (w[0], w[1], w[2]);
        let (mode, register, base) = (modrm >> 6, (modrm >> 3) & 7, modrm & 7);
        let argument = matches!(register, 1 | 2 | 6 | 7);
        let frame = base == 5 && matches!(mode, 1 | 2);
        let stack = base == 4 && sib == 0x24 && mode <= 2;
        opcode == 0x89 && argument && (frame || stack)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_stores_to_the_frame_or_stack_are_recognized() {
        // mov %rdi,-0x18(%rbp): a -O0 C function's entry.
        assert!(stores_an_argument(&[
            0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0x7d, 0xe8
        ]));
        // mov %rdi,0x8(%rsp): a Rust debug build's.
        assert!(stores_an_argument(&[
            0x48, 0x83, 0xec, 0x58, 0x48, 0x89, 0x7c, 0x24, 0x08
        ]));
        // mov %rsi,%rdx; mov 0x50(%rdx),%rsi: registers only.
        assert!(!stores_an_argument(&[
            0x48, 0x89, 0xf2, 0x48, 0x8b, 0x72, 0x50
        ]));
        // mov %rbx,-0x8(%rbp): not an argument register.
        assert!(!stores_an_argument(&[0x48, 0x89, 0x5d, 0xf8]));
    }

    #[test]
    fn the_share_decides() {
        let share = |functions, spilling| ArgumentSpills {
            functions,
            spilling,
        };
        assert!(share(13, 12).unoptimized());
        assert!(share(2254, 1176).unoptimized());
        assert!(!share(11, 1).unoptimized());
        assert!(!share(7, 3).unoptimized());
        assert!(!share(761, 91).unoptimized());
        assert!(!share(3, 3).unoptimized(), "too few functions to say");
    }
}
