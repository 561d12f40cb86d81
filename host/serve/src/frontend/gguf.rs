//! The tokenizer a GGUF model file carries in its metadata (llama.cpp's `tokenizer.ggml.*`
//! keys and `tokenizer.chat_template`), read so the router hashes the tokens the engine
//! serving that very file computes.
//!
//! Only the file's head is read: the header, then the metadata key-value pairs, in
//! bounded steps (`HEAD_STEPS`); the tensors after them never are. The format is ggml's
//! `docs/gguf.md` (versions 2 and 3, little-endian): `GGUF`, version `u32`, tensor count
//! `u64`, metadata count `u64`, then per pair a string key, a `u32` value type and the
//! value. Every length and count is checked against the bytes left before anything is
//! allocated for it, so a hostile file costs time linear in what was read and ends in an
//! error naming the byte it stopped at.

use std::path::Path;

use switchyard_plugin_host::file_gate::{self, FileKind};

/// How much of the file's head is read, in turn, until the metadata ends within it.
/// Real tokenizers take a few MB (a 262k-token vocabulary with its merges about 10 MB).
const HEAD_STEPS: [u64; 2] = [8 << 20, 256 << 20];

/// The tokenizer of a GGUF file, as llama.cpp reads it.
#[derive(Debug, Default)]
pub struct GgufTokenizer {
    /// `tokenizer.ggml.model`: `gpt2` for byte-level BPE, `llama` for SentencePiece, ...
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer (split rules) llama.cpp applies.
    pub pre: String,
    pub tokens: Vec<String>,
    /// llama.cpp's token types: 1 normal, 3 control, 4 user-defined, ...
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

/// Why a GGUF file's tokenizer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{0}")]
    File(#[from] file_gate::FileRefused),
    #[error("it does not start with `GGUF`: point `tokenizer:` at a GGUF model file or a tokenizer.json")]
    NotGguf,
    #[error("it is GGUF version {0}; the router reads versions 2 and 3")]
    Version(u32),
    #[error("its metadata is cut short at byte {at} ({what}): the file is truncated or not GGUF")]
    Truncated { at: usize, what: &'static str },
    #[error("its metadata does not end within its first {limit} bytes: not a model file the router can read")]
    TooLarge { limit: u64 },
    #[error("metadata `{key}` at byte {at}: {problem}")]
    Value {
        key: String,
        at: usize,
        problem: String,
    },
}

/// Reads the tokenizer metadata of the GGUF file at `path` (only its head).
pub fn read(path: &Path) -> Result<GgufTokenizer, GgufError> {
    let mut file = file_gate::open(path, FileKind::Gguf)?;
    let mut head = Vec::new();
    for limit in HEAD_STEPS {
        let more = limit.min(file.size()) - head.len() as u64;
        head.extend(file.read_head(more)?);
        match parse(&head) {
            Err(GgufError::Truncated { .. }) if (head.len() as u64) < file.size() => continue,
            result => return result,
        }
    }
    Err(GgufError::TooLarge {
        limit: HEAD_STEPS[HEAD_STEPS.len() - 1],
    })
}

/// The tokenizer in the metadata at the head of a GGUF file.
pub fn parse(bytes: &[u8]) -> Result<GgufTokenizer, GgufError> {
    let mut at = Cursor { bytes, at: 0 };
    if at.take(4, "magic")? != b"GGUF" {
        return Err(GgufError::NotGguf);
    }
    let version = at.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version(version));
    }
    let _tensors = at.u64("tensor count")?;
    let pairs = at.u64("metadata count")?;
    let mut found = GgufTokenizer::default();
    for _ in 0..pairs {
        let key = at.string("a key")?;
        let kind = at.u32("a value type")?;
        let start = at.at;
        let bad = |problem: String| GgufError::Value {
            key: key.to_owned(),
            at: start,
            problem,
        };
        match (key, kind) {
            ("tokenizer.ggml.model", STRING) => found.model = at.string("the model")?.to_owned(),
            ("tokenizer.ggml.pre", STRING) => {
                found.pre = at.string("the pre-tokenizer")?.to_owned()
            }
            ("tokenizer.chat_template", STRING) => {
                found.chat_template = Some(at.string("the chat template")?.to_owned());
            }
            ("tokenizer.ggml.tokens", ARRAY) => found.tokens = at.strings("the tokens", bad)?,
            ("tokenizer.ggml.merges", ARRAY) => found.merges = at.strings("the merges", bad)?,
            ("tokenizer.ggml.token_type", ARRAY) => {
                found.token_types = at.i32s("the token types", bad)?;
            }
            ("tokenizer.ggml.bos_token_id", UINT32) => found.bos = Some(at.u32("the BOS id")?),
            ("tokenizer.ggml.eos_token_id", UINT32) => found.eos = Some(at.u32("the EOS id")?),
            ("tokenizer.ggml.add_bos_token", BOOL) => {
                found.add_bos = at.take(1, "add_bos_token")?[0] != 0;
            }
            _ => at.skip(kind, bad)?,
        }
    }
    Ok(found)
}

const UINT32: u32 = 4;
const INT32: u32 = 5;
const BOOL: u32 = 7;
const STRING: u32 = 8;
const ARRAY: u32 = 9;

/// The size of a value of a fixed-size type; `None` for strings and arrays.
fn fixed_size(kind: u32) -> Option<usize> {
    match kind {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

struct Cursor<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'b [u8], GgufError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(GgufError::Truncated { at: self.at, what })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    /// A length that must fit in what is left (so nothing is allocated for a lie).
    fn len(&mut self, what: &'static str) -> Result<usize, GgufError> {
        let at = self.at;
        let n = self.u64(what)?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len() - self.at)
            .ok_or(GgufError::Truncated { at, what })
    }

    fn string(&mut self, what: &'static str) -> Result<&'b str, GgufError> {
        let at = self.at;
        let n = self.len(what)?;
        std::str::from_utf8(self.take(n, what)?).map_err(|_| GgufError::Value {
            key: what.to_owned(),
            at,
            problem: "a string that is not UTF-8".into(),
        })
    }

    /// An array header: its element type and count (each element at least `min` bytes,
    /// checked against what is left).
    fn array(&mut self, what: &'static str, min: usize) -> Result<(u32, usize), GgufError> {
        let kind = self.u32(what)?;
        let at = self.at;
        let n = self.len(what)?;
        if n.saturating_mul(min.max(1)) > self.bytes.len() - self.at {
            return Err(GgufError::Truncated { at, what });
        }
        Ok((kind, n))
    }

    fn strings(
        &mut self,
        what: &'static str,
        bad: impl Fn(String) -> GgufError,
    ) -> Result<Vec<String>, GgufError> {
        let (kind, n) = self.array(what, 8)?;
        if kind != STRING {
            return Err(bad(format!("an array of type {kind}, not of strings")));
        }
        (0..n)
            .map(|_| self.string(what).map(str::to_owned))
            .collect()
    }

    fn i32s(
        &mut self,
        what: &'static str,
        bad: impl Fn(String) -> GgufError,
    ) -> Result<Vec<i32>, GgufError> {
        let (kind, n) = self.array(what, 4)?;
        if kind != INT32 {
            return Err(bad(format!("an array of type {kind}, not of int32")));
        }
        let raw = self.take(n * 4, what)?;
        Ok(raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Skips a value of type `kind` (arrays of arrays included, each level checked).
    fn skip(
        &mut self,
        kind: u32,
        bad: impl Fn(String) -> GgufError + Copy,
    ) -> Result<(), GgufError> {
        if let Some(size) = fixed_size(kind) {
            return self.take(size, "a value").map(drop);
        }
        match kind {
            STRING => self.string("a value").map(drop),
            ARRAY => {
                let element = self.u32("an array's type")?;
                let at = self.at;
                let n = self.len("an array's length")?;
                match fixed_size(element) {
                    Some(size) => {
                        let bytes = n.checked_mul(size).ok_or(GgufError::Truncated {
                            at,
                            what: "an array",
                        })?;
                        self.take(bytes, "an array").map(drop)
                    }
                    None => (0..n).try_for_each(|_| self.skip(element, bad)),
                }
            }
            other => Err(bad(format!(
                "value type {other}, which GGUF does not define"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A GGUF head with `pairs` written by `write`.
    fn head(pairs: u64, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend(pairs.to_le_bytes());
        write(&mut out);
        out
    }

    #[test]
    fn reads_the_tokenizer_and_skips_the_rest() {
        let bytes = head(4, |out| {
            string(out, "general.languages");
            out.extend(ARRAY.to_le_bytes());
            out.extend(STRING.to_le_bytes());
            out.extend(1u64.to_le_bytes());
            string(out, "en");
            string(out, "tokenizer.ggml.model");
            out.extend(STRING.to_le_bytes());
            string(out, "gpt2");
            string(out, "tokenizer.ggml.tokens");
            out.extend(ARRAY.to_le_bytes());
            out.extend(STRING.to_le_bytes());
            out.extend(2u64.to_le_bytes());
            string(out, "a");
            string(out, "b");
            string(out, "tokenizer.ggml.bos_token_id");
            out.extend(UINT32.to_le_bytes());
            out.extend(1u32.to_le_bytes());
        });
        let found = parse(&bytes).unwrap();
        assert_eq!(found.model, "gpt2");
        assert_eq!(found.tokens, ["a", "b"]);
        assert_eq!(found.bos, Some(1));
    }

    #[test]
    fn lies_about_lengths_end_in_an_error_without_allocating() {
        // A vocabulary of 2^60 tokens in a 60-byte file.
        let bytes = head(1, |out| {
            string(out, "tokenizer.ggml.tokens");
            out.extend(ARRAY.to_le_bytes());
            out.extend(STRING.to_le_bytes());
            out.extend((1u64 << 60).to_le_bytes());
        });
        assert!(matches!(parse(&bytes), Err(GgufError::Truncated { .. })));
        // An array of arrays of u64 whose byte size overflows.
        let bytes = head(1, |out| {
            string(out, "x");
            out.extend(ARRAY.to_le_bytes());
            out.extend(10u32.to_le_bytes());
            out.extend(u64::MAX.to_le_bytes());
        });
        assert!(matches!(parse(&bytes), Err(GgufError::Truncated { .. })));
        assert!(matches!(parse(b"GGML...."), Err(GgufError::NotGguf)));
        let mut wrong = head(0, |_| {});
        wrong[4] = 9;
        assert!(matches!(parse(&wrong), Err(GgufError::Version(9))));
        // Every prefix of a valid head fails cleanly (no panic).
        let valid = head(1, |out| {
            string(out, "tokenizer.ggml.pre");
            out.extend(STRING.to_le_bytes());
            string(out, "smollm");
        });
        for cut in 0..valid.len() {
            assert!(parse(&valid[..cut]).is_err(), "{cut}");
        }
        assert_eq!(parse(&valid).unwrap().pre, "smollm");
    }
}
