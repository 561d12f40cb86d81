//! A plugin's image: the bytes of its file as they were read once and checked, in a
//! sealed memfd that `dlopen` maps (`/proc/self/fd/N`). A library mapped from its own
//! file changes under the router when that file is overwritten in place (`cp new.so
//! loaded.so` keeps the inode, and the page cache hands the new bytes to the old
//! mapping): the router ran another version's code, or died of SIGILL at its next call,
//! `sha256:` pin or not. A sealed memfd cannot be written, grown or shrunk by anyone, so
//! the code mapped is the code that was checked and pinned, until a reload reads the file
//! again. An isolated plugin's child gets the same memfd (its restarts too), so it loads
//! the bytes the router checked, not the file as it is now.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::elf_check;
use super::load_error::LoadError;
use crate::file_gate::{self, FileKind, FileRefused};

/// What makes a memfd immutable: no writes, no size change, and no removing these.
const SEALS: libc::c_int =
    libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The checked bytes of one plugin file, sealed; `path` is the file they were read from
/// (every message names it, never the memfd).
pub struct PluginImage {
    memfd: OwnedFd,
    path: PathBuf,
    len: u64,
}

/// An image's bytes, mapped read-only; unmapped when dropped.
pub struct MappedImage {
    at: *mut libc::c_void,
    len: usize,
}

impl std::ops::Deref for MappedImage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `at` is a live mapping of `len` readable bytes that nobody writes
        // (the memfd is sealed against writes), until `drop` unmaps it.
        unsafe { std::slice::from_raw_parts(self.at.cast::<u8>(), self.len) }
    }
}

impl Drop for MappedImage {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping `PluginImage::map` made; no slice of it outlives
        // this guard (they borrow it).
        unsafe { libc::munmap(self.at, self.len) };
    }
}

impl std::fmt::Debug for PluginImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginImage")
            .field("path", &self.path)
            .field("memfd", &self.memfd.as_raw_fd())
            .field("len", &self.len)
            .finish()
    }
}

/// A plugin file the gate refused, as the loader's error.
fn refused(path: &Path, error: FileRefused) -> LoadError {
    let path = path.to_owned();
    match error {
        FileRefused::Unopenable(source) => LoadError::FileNotFound { path, source },
        FileRefused::NotRegular { found, .. } => LoadError::NotARegularFile { path, found },
        FileRefused::Empty { .. } => LoadError::NotARegularFile {
            path,
            found: "an empty file (or one that reports no size, as /proc files do)",
        },
        FileRefused::TooLarge { bytes, kind } => LoadError::FileTooLarge {
            path,
            bytes,
            limit: kind.limit(),
        },
        error => LoadError::Unreadable { path, error },
    }
}

fn io_error(path: &Path, what: &str) -> LoadError {
    LoadError::Unsealable {
        path: path.to_owned(),
        what: what.to_owned(),
        error: std::io::Error::last_os_error(),
    }
}

/// The memfd's name, which `/proc/PID/maps` shows (`/memfd:switchyard-plugin:NAME`):
/// the file's name, so an operator or a profiler can tell the libraries apart.
fn memfd_name(path: &Path) -> std::ffi::CString {
    let file = path.file_name().unwrap_or_default().to_string_lossy();
    let mut name: String = format!("switchyard-plugin:{file}");
    // The kernel takes at most 249 bytes; a NUL inside would end the name early.
    name.retain(|c| c != '\0');
    while name.len() > 240 {
        name.pop();
    }
    std::ffi::CString::new(name).unwrap_or_default()
}

/// A new memfd that may hold code: `MFD_EXEC` where the kernel knows it (Linux 6.3+,
/// whose `vm.memfd_noexec` may otherwise make memfds non-executable), plain before.
fn new_memfd(path: &Path) -> Result<OwnedFd, LoadError> {
    let name = memfd_name(path);
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `name` is a NUL-terminated string; the flags are memfd_create's.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_EXEC) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    if fd < 0 {
        return Err(io_error(path, "create a memfd for it"));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl PluginImage {
    /// Reads the plugin file at `path` once, through the file gate, into a sealed memfd:
    /// a regular file of bounded size, its ELF header checked before the rest is read (a
    /// 1 GiB file of anything else is refused after 64 bytes, not read whole first), the
    /// rest copied by the kernel (no buffer of the file's size).
    pub fn read(path: &Path) -> Result<Arc<PluginImage>, LoadError> {
        use std::io::Write;
        let mut file = file_gate::open(path, FileKind::Plugin).map_err(|e| refused(path, e))?;
        let head = file
            .read_head(elf_check::HEADER_BYTES as u64)
            .map_err(|e| refused(path, e))?;
        elf_check::check_header(path, &head)?;
        let mut memfd = std::fs::File::from(new_memfd(path)?);
        memfd
            .write_all(&head)
            .map_err(|error| LoadError::Unsealable {
                path: path.to_owned(),
                what: "copy it into a memfd".into(),
                error,
            })?;
        file.copy_rest_to(&mut memfd)
            .map_err(|e| refused(path, e))?;
        let memfd = OwnedFd::from(memfd);
        // SAFETY: F_ADD_SEALS on a memfd this function owns.
        if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io_error(path, "seal its memfd"));
        }
        Ok(Arc::new(PluginImage {
            memfd,
            path: path.to_owned(),
            len: file.size(),
        }))
    }

    /// The image an isolated child was passed for `path`: it must be sealed, or the bytes
    /// it maps could still change.
    pub fn received(path: &Path, memfd: OwnedFd) -> Result<Arc<PluginImage>, LoadError> {
        // SAFETY: F_GET_SEALS on a descriptor this function owns.
        let seals = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            return Err(LoadError::Unsealable {
                path: path.to_owned(),
                what: "load the image the router passed: it is not a sealed memfd".into(),
                error: std::io::Error::from_raw_os_error(libc::EBADF),
            });
        }
        let len =
            std::fs::File::from(memfd.try_clone().map_err(|error| LoadError::Unsealable {
                path: path.to_owned(),
                what: "read the image the router passed".into(),
                error,
            })?)
            .metadata()
            .map_or(0, |m| m.len());
        Ok(Arc::new(PluginImage {
            memfd,
            path: path.to_owned(),
            len,
        }))
    }

    /// The sealed bytes, mapped read-only: what the checks see is what `dlopen` maps.
    pub fn map(&self) -> Result<MappedImage, LoadError> {
        let len = usize::try_from(self.len).unwrap_or(usize::MAX);
        // SAFETY: a new private read-only mapping of a sealed memfd of `len` bytes, which
        // nobody can shrink (F_SEAL_SHRINK), so every byte of it stays readable.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                self.memfd.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED || len == 0 {
            return Err(io_error(&self.path, "map its sealed copy"));
        }
        Ok(MappedImage { at, len })
    }

    /// The memfd, to pass to an isolated child.
    pub fn memfd(&self) -> &OwnedFd {
        &self.memfd
    }

    /// The name `dlopen` opens the image by.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.memfd.as_raw_fd()))
    }
}
