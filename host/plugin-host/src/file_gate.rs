//! The one gate every file the config names passes before a byte of it is read: TLS
//! certificates, keys and CAs, API key files, the NATS token, tokenizers and their chat
//! templates, plugin libraries, and the config itself. The file is opened non-blocking
//! (opening a FIFO would otherwise wait for a writer forever), the opened descriptor is
//! checked (not a second look at the path, which may have changed in between) to be a
//! regular file of a size its kind can have, and it is read in bounded steps, never past
//! the size it had when opened: `/dev/zero` or a `/proc` file would otherwise be read, and
//! allocated, without end.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// What a file is for; each kind has its own size bound and name in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Config,
    Plugin,
    /// PEM certificates: a listener's chain, a client or engine CA bundle.
    Certificate,
    PrivateKey,
    ApiKeys,
    /// `replicas.token_file`.
    Token,
    Tokenizer,
    /// `tokenizer_config.json`, where the chat template is.
    TokenizerConfig,
    /// A GGUF model file, of which only the metadata at its head is read (its tokenizer).
    Gguf,
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The most read at once: a large file is read in steps of this size.
const STEP: u64 = MIB;

impl FileKind {
    /// The largest file of this kind that is read. Each is far above what a real one
    /// holds (the biggest shared libraries shipped, with debug info, are a few hundred MB;
    /// a system CA bundle ~200 KB; the largest tokenizer.json files some tens of MB).
    pub const fn limit(self) -> u64 {
        match self {
            FileKind::Config => 16 * MIB,
            FileKind::Plugin => 1 << 30,
            FileKind::Certificate => 16 * MIB,
            FileKind::PrivateKey => MIB,
            FileKind::ApiKeys => 64 * KIB,
            FileKind::Token => 64 * KIB,
            FileKind::Tokenizer => 512 * MIB,
            FileKind::TokenizerConfig => 64 * MIB,
            // The size of the whole model; only its head is read (`GGUF_HEAD_LIMIT`).
            FileKind::Gguf => 1 << 42,
        }
    }

    /// What the file should be, in words ("point it at {noun}").
    pub const fn noun(self) -> &'static str {
        match self {
            FileKind::Config => "a YAML config file",
            FileKind::Plugin => "a plugin library (a .so)",
            FileKind::Certificate => "a PEM certificate file",
            FileKind::PrivateKey => "a PEM private key file",
            FileKind::ApiKeys => "a text file of API keys",
            FileKind::Token => "a text file holding the token",
            FileKind::Tokenizer => "a Hugging Face tokenizer.json",
            FileKind::TokenizerConfig => "a tokenizer_config.json",
            FileKind::Gguf => "a GGUF model file",
        }
    }
}

/// Why a file was not read. The path and the setting are the caller's to name.
#[derive(Debug, thiserror::Error)]
pub enum FileRefused {
    #[error("cannot read it ({0})")]
    Unopenable(#[source] std::io::Error),
    #[error("it is {found}, not a regular file: point it at {}", kind.noun())]
    NotRegular { found: &'static str, kind: FileKind },
    #[error("it is empty (or reports no size, as /proc files do): point it at {}", kind.noun())]
    Empty { kind: FileKind },
    #[error("it has {bytes} bytes, more than the {} {} may have: point it at {}", kind.limit(), kind.noun(), kind.noun())]
    TooLarge { bytes: u64, kind: FileKind },
    #[error("cannot read it ({0})")]
    Unreadable(#[source] std::io::Error),
    #[error("it was cut short while it was read ({read} of {size} bytes): is something writing it? Try again once it is written")]
    CutShort { read: u64, size: u64 },
    #[error("it is not UTF-8 text: point it at {}", kind.noun())]
    NotText { kind: FileKind },
}

impl FileRefused {
    /// The file does not exist (some files are optional).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FileRefused::Unopenable(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// A file that passed the gate: open, regular, of a bounded size; read it with
/// `read_head` and `read_rest`.
#[derive(Debug)]
pub struct GatedFile {
    file: File,
    size: u64,
    read: u64,
}

/// What an open file is when it is not a regular file.
fn not_regular(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_file() {
        None
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_dir() {
        Some("a directory")
    } else {
        Some("not a regular file")
    }
}

/// Opens `path` as a file of `kind`: refused at once, before a byte is read, unless it is
/// a regular file of 1 to `kind.limit()` bytes.
pub fn open(path: &Path, kind: FileKind) -> Result<GatedFile, FileRefused> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(FileRefused::Unopenable)?;
    let meta = file.metadata().map_err(FileRefused::Unopenable)?;
    if let Some(found) = not_regular(meta.file_type()) {
        return Err(FileRefused::NotRegular { found, kind });
    }
    match meta.len() {
        // An empty config is its parser's to explain; nothing is read of it (a /proc file
        // reports no size either, and reads as empty here).
        0 if kind == FileKind::Config => Ok(GatedFile {
            file,
            size: 0,
            read: 0,
        }),
        0 => Err(FileRefused::Empty { kind }),
        bytes if bytes > kind.limit() => Err(FileRefused::TooLarge { bytes, kind }),
        size => Ok(GatedFile {
            file,
            size,
            read: 0,
        }),
    }
}

impl GatedFile {
    /// The file's size when it was opened: the most that is read of it.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Reads up to `bytes` more of the file into `into`, in bounded steps, never past
    /// the size it had when opened; a file cut short meanwhile is an error.
    fn read_up_to(&mut self, into: &mut Vec<u8>, bytes: u64) -> Result<(), FileRefused> {
        let end = self.size.min(self.read.saturating_add(bytes));
        while self.read < end {
            let step = (end - self.read).min(STEP);
            let got = (&self.file)
                .take(step)
                .read_to_end(into)
                .map_err(FileRefused::Unreadable)? as u64;
            if got == 0 {
                return Err(FileRefused::CutShort {
                    read: self.read,
                    size: self.size,
                });
            }
            self.read += got;
        }
        Ok(())
    }

    /// The first `bytes` of the file (fewer if it is shorter).
    pub fn read_head(&mut self, bytes: u64) -> Result<Vec<u8>, FileRefused> {
        let mut head = Vec::with_capacity(bytes.min(self.size) as usize);
        self.read_up_to(&mut head, bytes)?;
        Ok(head)
    }

    /// Copies the rest of the file into `out`, never past the size it had when opened
    /// (the kernel copies, in its own steps; no buffer of the file's size is allocated).
    pub fn copy_rest_to(&mut self, out: &mut File) -> Result<(), FileRefused> {
        let rest = self.size - self.read;
        let copied =
            std::io::copy(&mut (&self.file).take(rest), out).map_err(FileRefused::Unreadable)?;
        self.read += copied;
        if copied < rest {
            return Err(FileRefused::CutShort {
                read: self.read,
                size: self.size,
            });
        }
        Ok(())
    }

    /// The rest of the file, appended to `bytes` (what `read_head` returned, if called).
    pub fn read_rest(&mut self, bytes: &mut Vec<u8>) -> Result<(), FileRefused> {
        bytes.reserve((self.size - self.read) as usize);
        self.read_up_to(bytes, u64::MAX)
    }
}

/// The whole file at `path`, through the gate.
pub fn read(path: &Path, kind: FileKind) -> Result<Vec<u8>, FileRefused> {
    let mut file = open(path, kind)?;
    let mut bytes = Vec::new();
    file.read_rest(&mut bytes)?;
    Ok(bytes)
}

/// The whole file at `path` as UTF-8 text, through the gate.
pub fn read_text(path: &Path, kind: FileKind) -> Result<String, FileRefused> {
    String::from_utf8(read(path, kind)?).map_err(|_| FileRefused::NotText { kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_directories_are_refused_by_what_they_are() {
        let dir = std::env::temp_dir();
        let refused = |path: &Path| open(path, FileKind::Certificate).unwrap_err().to_string();
        assert!(refused(Path::new("/dev/zero")).contains("is a character device"));
        assert!(refused(&dir).contains("is a directory"));
        assert!(refused(Path::new("/proc/self/status")).contains("is empty"));
    }

    #[test]
    fn a_file_is_read_whole_in_steps() {
        let dir = std::env::temp_dir().join(format!("file-gate-{}", std::process::id()));
        let bytes: Vec<u8> = (0..(3 * STEP + 17)).map(|i| i as u8).collect();
        std::fs::write(&dir, &bytes).unwrap();
        let mut file = open(&dir, FileKind::Tokenizer).unwrap();
        let mut read = file.read_head(4).unwrap();
        file.read_rest(&mut read).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(read, bytes);
        let too_large = read.len() as u64 > FileKind::ApiKeys.limit();
        assert!(too_large);
    }
}
