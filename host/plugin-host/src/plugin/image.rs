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

/// The bytes of the plugin file at `path`, through the file gate: a regular file of
/// bounded size, its ELF header checked before the rest is read (a 1 GiB file of
/// anything else is refused after 64 bytes, not read whole first).
pub fn read_plugin_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    let mut file = file_gate::open(path, FileKind::Plugin).map_err(|e| refused(path, e))?;
    let mut bytes = file
        .read_head(elf_check::HEADER_BYTES as u64)
        .map_err(|e| refused(path, e))?;
    elf_check::check_header(path, &bytes)?;
    file.read_rest(&mut bytes).map_err(|e| refused(path, e))?;
    Ok(bytes)
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
    /// `bytes` (the checked bytes of the file at `path`) in a new sealed memfd.
    pub fn seal(path: &Path, bytes: &[u8]) -> Result<Arc<PluginImage>, LoadError> {
        use std::io::Write;
        let memfd = new_memfd(path)?;
        let mut file = std::fs::File::from(memfd);
        file.write_all(bytes)
            .map_err(|error| LoadError::Unsealable {
                path: path.to_owned(),
                what: "copy it into a memfd".into(),
                error,
            })?;
        let memfd = OwnedFd::from(file);
        // SAFETY: F_ADD_SEALS on a memfd this function owns.
        if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io_error(path, "seal its memfd"));
        }
        Ok(Arc::new(PluginImage {
            memfd,
            path: path.to_owned(),
            len: bytes.len() as u64,
        }))
    }

    /// Reads the plugin file at `path` once, through the gate, into a sealed memfd.
    pub fn read(path: &Path) -> Result<Arc<PluginImage>, LoadError> {
        Self::seal(path, &read_plugin_file(path)?)
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

    /// The sealed bytes, read back (what the checks see is what is mapped).
    pub fn bytes(&self) -> Result<Vec<u8>, LoadError> {
        use std::os::unix::fs::FileExt;
        let file = std::mem::ManuallyDrop::new(
            // SAFETY: a borrowed view of our own descriptor, never closed (ManuallyDrop).
            unsafe { std::fs::File::from_raw_fd(self.memfd.as_raw_fd()) },
        );
        let mut bytes = vec![0; self.len as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(|error| LoadError::Unsealable {
                path: self.path.clone(),
                what: "read its sealed copy".into(),
                error,
            })?;
        Ok(bytes)
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
