//! vLLM's (and SGLang's) KV-event payload, field by field as `vllm/distributed/kv_events.py`
//! of the released wheels defines it (v0.23.0 and v0.33.0 were read):
//!
//! - a batch is the msgpack array `[ts: float, events: list, data_parallel_rank: int]`
//!   (`EventBatch`, `array_like`; the rank may be omitted when None);
//! - an event is tagged by its class name. Up to v0.23 (`KVCacheEvent` with `array_like`)
//!   it is a positional array `[tag, field...]`; from v0.24 it is a map whose `type` key is
//!   the tag, defaults that are None omitted, and later versions add keys. Both are read;
//!   unknown keys and trailing fields are ignored.
//! - block hashes (`ExternalBlockHash = bytes | int`) are unsigned 64-bit integers or
//!   32-byte digests; a digest is keyed by its last 8 bytes, big-endian, which is exactly
//!   the integer vLLM publishes for it with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`.
//!
//! The encoder writes the same format, for `engine-sim` and the tests.

mod event;

use rmp::Marker;
use rmpv::{Integer, Value};

pub use event::{MAX_PART_BLOCKS, MAX_PART_TOKENS};

/// Field order of the positional (array) form, after the tag.
const STORED_FIELDS: [&str; 15] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
];
const REMOVED_FIELDS: [&str; 5] = [
    "block_hashes",
    "medium",
    "group_idx",
    "locality",
    "ownership",
];

/// One decoded batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The publisher's clock, seconds since the Unix epoch.
    pub ts: f64,
    pub events: Vec<EngineEvent>,
    pub data_parallel_rank: Option<u32>,
    /// Events that were not understood (skipped, counted), with why.
    pub malformed: Vec<String>,
}

/// `BlockStored`: blocks newly cached (or reused) by the engine, in prefix order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredBlocks {
    pub block_hashes: Vec<u64>,
    pub parent_block_hash: Option<u64>,
    /// The tokens of the stored blocks only (`block_size` per block).
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
    pub medium: Option<String>,
    /// Per block, a digest of its extra hash keys (multimodal inputs, cache salt, ...),
    /// 0 where it has none; empty when the event carries none at all.
    pub extra_keys: Vec<u64>,
    pub group_idx: Option<i64>,
    pub kv_cache_spec_kind: Option<String>,
}

/// `BlockRemoved`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemovedBlocks {
    pub block_hashes: Vec<u64>,
    pub medium: Option<String>,
    pub group_idx: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    Stored(StoredBlocks),
    Removed(RemovedBlocks),
    AllCleared,
}

/// A payload that is not a batch at all (as opposed to one bad event in a batch).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(String);

/// Decodes one batch payload whole (events and problems all kept): for tools and tests.
/// The subscriber uses [`head`] and [`decode_events`], which keep one chunk at a time.
pub fn decode(payload: &[u8]) -> Result<Batch, DecodeError> {
    let head = head(payload)?;
    let mut events = Vec::new();
    let skipped = decode_events(payload, usize::MAX, |chunk| events.append(chunk))?;
    Ok(Batch {
        ts: head.ts,
        events,
        data_parallel_rank: head.data_parallel_rank,
        malformed: skipped.problems,
    })
}

/// A batch's fields around its events.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchHead {
    /// The publisher's clock, seconds since the Unix epoch.
    pub ts: f64,
    pub data_parallel_rank: Option<u32>,
    pub events: u32,
}

fn not_a_batch(problem: String) -> DecodeError {
    DecodeError(format!(
        "not a batch [ts, events, data_parallel_rank]: {problem}"
    ))
}

/// Reads `[ts, events` and returns the count of events.
fn open_batch(r: &mut Reader<'_>) -> Result<(f64, u32), DecodeError> {
    let fields = r.array_len().map_err(not_a_batch)?;
    if fields < 2 {
        return Err(not_a_batch(format!("an array of {fields} fields")));
    }
    let ts = r.number().map_err(|e| not_a_batch(format!("ts: {e}")))?;
    let events = r
        .array_len()
        .map_err(|e| not_a_batch(format!("events: {e}")))?;
    Ok((ts, events))
}

/// Reads a batch's head in one pass that decodes no event but checks each is a whole
/// msgpack value: a batch is refused whole (nothing of it applied) or decodes to the end.
/// Allocates nothing.
pub fn head(payload: &[u8]) -> Result<BatchHead, DecodeError> {
    let mut r = Reader(payload);
    let fields = r.array_len().map_err(not_a_batch)?;
    r.0 = payload;
    let (ts, events) = open_batch(&mut r)?;
    for _ in 0..events {
        r.skip(0).map_err(|e| not_a_batch(format!("events: {e}")))?;
    }
    let mut data_parallel_rank = None;
    if fields >= 3 && !r.nil() {
        let rank = r
            .u32()
            .map_err(|e| not_a_batch(format!("data_parallel_rank: {e}")))?;
        data_parallel_rank = Some(rank);
    }
    Ok(BatchHead {
        ts,
        data_parallel_rank,
        events,
    })
}

/// Events decoded before they are handed on: what a batch costs beyond its own bytes is
/// at most this many decoded events (or [`CHUNK_BYTES`] of their vectors), whatever its
/// size. A million `AllBlocksCleared` otherwise decode to ~200 MB from 18 MB of payload.
pub const CHUNK_EVENTS: usize = 1024;
/// The decoded vectors (hashes, token ids) of one chunk, at most about this many bytes
/// beyond its last event.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The events of a batch that were skipped, and why (the first few reasons kept).
#[derive(Debug, Default)]
pub struct Skipped {
    pub count: u64,
    pub problems: Vec<String>,
}

/// Decodes the events of `payload` (a batch [`head`] accepted) in order, in chunks
/// handed to `apply` (which may take them; what it leaves is cleared), reading values in
/// place (no value tree). An event that does not
/// make sense is skipped whole and counted, `keep_problems` of the reasons kept.
pub fn decode_events(
    payload: &[u8],
    keep_problems: usize,
    mut apply: impl FnMut(&mut Vec<EngineEvent>),
) -> Result<Skipped, DecodeError> {
    let mut r = Reader(payload);
    let (_, events) = open_batch(&mut r)?;
    let mut skipped = Skipped::default();
    let mut chunk = Vec::with_capacity((events as usize).min(CHUNK_EVENTS));
    let mut chunk_bytes = 0usize;
    for _ in 0..events {
        let start = r.0;
        match event::read(&mut r) {
            Ok(Some(parsed)) => event::emit(parsed, &mut |event| {
                chunk_bytes += decoded_bytes(&event);
                chunk.push(event);
                if chunk.len() >= CHUNK_EVENTS || chunk_bytes >= CHUNK_BYTES {
                    apply(&mut chunk);
                    chunk.clear();
                    chunk_bytes = 0;
                }
            }),
            Ok(None) => {} // a class this router does not know: newer vLLM
            Err(problem) => {
                skipped.count += 1;
                if skipped.problems.len() < keep_problems {
                    skipped.problems.push(problem);
                }
                r.0 = start;
                r.skip(0).map_err(|e| not_a_batch(format!("events: {e}")))?;
            }
        }
    }
    if !chunk.is_empty() {
        apply(&mut chunk);
    }
    Ok(skipped)
}

/// The bytes of an event's decoded vectors.
fn decoded_bytes(event: &EngineEvent) -> usize {
    match event {
        EngineEvent::Stored(s) => {
            8 * (s.block_hashes.len() + s.extra_keys.len()) + 4 * s.token_ids.len()
        }
        EngineEvent::Removed(r) => 8 * r.block_hashes.len(),
        EngineEvent::AllCleared => 0,
    }
}

/// Values deeper than this are refused (a hostile payload cannot exhaust the stack).
const MAX_DEPTH: usize = 16;

/// A msgpack cursor over one payload.
#[derive(Clone, Copy)]
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<Marker> {
        self.0.first().map(|&b| Marker::from_u8(b))
    }

    /// Consumes a nil if one is next.
    fn nil(&mut self) -> bool {
        let nil = self.peek() == Some(Marker::Null);
        if nil {
            self.0 = &self.0[1..];
        }
        nil
    }

    fn array_len(&mut self) -> Result<u32, String> {
        rmp::decode::read_array_len(&mut self.0).map_err(|e| format!("expected an array ({e})"))
    }

    fn map_len(&mut self) -> Result<u32, String> {
        rmp::decode::read_map_len(&mut self.0).map_err(|e| format!("expected a map ({e})"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        rmp::decode::read_int(&mut self.0)
            .map_err(|e| format!("expected an integer in range ({e})"))
    }

    fn u64(&mut self) -> Result<u64, String> {
        rmp::decode::read_int(&mut self.0)
            .map_err(|e| format!("expected an integer in range ({e})"))
    }

    fn i64(&mut self) -> Result<i64, String> {
        rmp::decode::read_int(&mut self.0)
            .map_err(|e| format!("expected an integer in range ({e})"))
    }

    fn number(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some(Marker::F64) => rmp::decode::read_f64(&mut self.0).map_err(|e| e.to_string()),
            Some(Marker::F32) => rmp::decode::read_f32(&mut self.0)
                .map(f64::from)
                .map_err(|e| e.to_string()),
            _ => self
                .i64()
                .map(|n| n as f64)
                .map_err(|_| "expected a number".into()),
        }
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let (text, rest) = rmp::decode::read_str_from_slice(self.0)
            .map_err(|e| format!("expected a UTF-8 string ({e})"))?;
        self.0 = rest;
        Ok(text)
    }

    fn string(&mut self) -> Result<String, String> {
        self.str().map(str::to_owned)
    }

    /// A block hash: an unsigned 64-bit integer, or a digest keyed by its last 8 bytes.
    fn hash(&mut self) -> Result<u64, String> {
        match self.peek() {
            Some(Marker::Bin8 | Marker::Bin16 | Marker::Bin32) => {
                let n = rmp::decode::read_bin_len(&mut self.0).map_err(|e| e.to_string())? as usize;
                let bytes = self.take(n)?;
                let tail = bytes
                    .last_chunk::<8>()
                    .ok_or_else(|| format!("a block hash digest of {n} bytes (at least 8 expected)"))?;
                Ok(u64::from_be_bytes(*tail))
            }
            _ => self
                .u64()
                .map_err(|_| "a block hash must be an unsigned 64-bit integer or a digest of at least 8 bytes".into()),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("the payload ends inside a value".into());
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    /// Skips the next value and returns its bytes (from `start`, where it began).
    fn raw(&mut self, start: &'a [u8]) -> Result<&'a [u8], String> {
        self.skip(0)?;
        Ok(&start[..start.len() - self.0.len()])
    }

    /// Skips one value, whatever it is.
    fn skip(&mut self, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("values nested deeper than {MAX_DEPTH}"));
        }
        let marker = rmp::decode::read_marker(&mut self.0)
            .map_err(|_| "the payload ends inside a value".to_owned())?;
        let mut len = |bytes: usize| -> Result<usize, String> {
            let be = self.take(bytes)?;
            Ok(be.iter().fold(0usize, |n, &b| n << 8 | usize::from(b)))
        };
        let (data, children) = match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                (0, 0)
            }
            Marker::U8 | Marker::I8 => (1, 0),
            Marker::U16 | Marker::I16 => (2, 0),
            Marker::U32 | Marker::I32 | Marker::F32 => (4, 0),
            Marker::U64 | Marker::I64 | Marker::F64 => (8, 0),
            Marker::FixStr(n) => (usize::from(n), 0),
            Marker::Str8 | Marker::Bin8 => (len(1)?, 0),
            Marker::Str16 | Marker::Bin16 => (len(2)?, 0),
            Marker::Str32 | Marker::Bin32 => (len(4)?, 0),
            Marker::FixArray(n) => (0, usize::from(n)),
            Marker::Array16 => (0, len(2)?),
            Marker::Array32 => (0, len(4)?),
            Marker::FixMap(n) => (0, 2 * usize::from(n)),
            Marker::Map16 => (0, 2 * len(2)?),
            Marker::Map32 => (0, 2 * len(4)?),
            Marker::FixExt1 => (2, 0),
            Marker::FixExt2 => (3, 0),
            Marker::FixExt4 => (5, 0),
            Marker::FixExt8 => (9, 0),
            Marker::FixExt16 => (17, 0),
            Marker::Ext8 => (len(1)? + 1, 0),
            Marker::Ext16 => (len(2)? + 1, 0),
            Marker::Ext32 => (len(4)? + 1, 0),
            Marker::Reserved => return Err("a reserved msgpack marker (0xc1)".into()),
        };
        self.take(data)?;
        for _ in 0..children {
            self.skip(depth + 1)?;
        }
        Ok(())
    }
}

/// A stable digest of an encoded value (FNV-1a over its bytes), never 0.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &byte in bytes {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash.max(1)
}

/// The sequence number and payload of one message's frames: `[topic, seq, payload]`
/// (live, and replay replies from v0.26), or `[seq, payload]` (replies before v0.26).
/// A replay reply's leading empty delimiter must be removed first.
pub fn split_frames<B: AsRef<[u8]>>(frames: &[B]) -> Option<(u64, &[u8])> {
    let (sequence, payload) = match frames {
        [_topic, sequence, payload] => (sequence, payload),
        [sequence, payload] => (sequence, payload),
        _ => return None,
    };
    let sequence = <[u8; 8]>::try_from(sequence.as_ref()).ok()?;
    Some((u64::from_be_bytes(sequence), payload.as_ref()))
}

/// The sequence number of the replay socket's end marker.
pub const END_SEQUENCE: u64 = u64::MAX;

/// How events are laid out on the wire: vLLM up to v0.23, or v0.24 and later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventForm {
    /// `["BlockStored", field, ...]`, every slot present.
    Array,
    /// `{"type": "BlockStored", field: value, ...}`, None defaults omitted.
    Map,
}

/// How a block hash is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HashForm {
    /// An unsigned 64-bit integer.
    Int,
    /// A 32-byte digest whose last 8 bytes are the hash, big-endian.
    Bytes,
}

fn hash_value(hash: u64, form: HashForm) -> Value {
    match form {
        HashForm::Int => Value::Integer(Integer::from(hash)),
        HashForm::Bytes => {
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(&hash.rotate_left(17).to_le_bytes());
            digest[24..].copy_from_slice(&hash.to_be_bytes());
            Value::Binary(digest.to_vec())
        }
    }
}

fn optional<T: Into<Value>>(value: Option<T>) -> Value {
    value.map_or(Value::Nil, Into::into)
}

fn encode_event(event: &EngineEvent, form: EventForm, hash_form: HashForm) -> Value {
    let hashes = |h: &[u64]| Value::Array(h.iter().map(|&h| hash_value(h, hash_form)).collect());
    let (tag, fields): (&str, Vec<(&str, Value)>) = match event {
        EngineEvent::Stored(s) => (
            "BlockStored",
            vec![
                ("block_hashes", hashes(&s.block_hashes)),
                (
                    "parent_block_hash",
                    s.parent_block_hash
                        .map_or(Value::Nil, |h| hash_value(h, hash_form)),
                ),
                (
                    "token_ids",
                    Value::Array(s.token_ids.iter().map(|&t| Value::from(t)).collect()),
                ),
                ("block_size", Value::from(s.block_size)),
                ("lora_id", optional(s.lora_id)),
                ("medium", optional(s.medium.clone())),
                ("lora_name", optional(s.lora_name.clone())),
                ("extra_keys", Value::Nil),
                ("group_idx", optional(s.group_idx)),
                ("kv_cache_spec_kind", optional(s.kv_cache_spec_kind.clone())),
                ("kv_cache_spec_sliding_window", Value::Nil),
            ],
        ),
        EngineEvent::Removed(r) => (
            "BlockRemoved",
            vec![
                ("block_hashes", hashes(&r.block_hashes)),
                ("medium", optional(r.medium.clone())),
                ("group_idx", optional(r.group_idx)),
            ],
        ),
        EngineEvent::AllCleared => ("AllBlocksCleared", Vec::new()),
    };
    match form {
        EventForm::Array => Value::Array(
            std::iter::once(Value::from(tag))
                .chain(fields.into_iter().map(|(_, v)| v))
                .collect(),
        ),
        // Required fields are always written; optional ones only when set (msgspec's
        // omit_defaults omits only fields that have a default).
        EventForm::Map => Value::Map(
            std::iter::once((Value::from("type"), Value::from(tag)))
                .chain(
                    fields
                        .into_iter()
                        .filter(|(k, v)| !(v.is_nil() && has_default(tag, k)))
                        .map(|(k, v)| (Value::from(k), v)),
                )
                .collect(),
        ),
    }
}

fn has_default(tag: &str, field: &str) -> bool {
    match tag {
        "BlockStored" => STORED_FIELDS.iter().position(|f| *f == field) >= Some(7),
        "BlockRemoved" => field != "block_hashes" && field != "medium",
        _ => true,
    }
}

/// Encodes a batch as vLLM's publisher does.
pub fn encode(
    ts: f64,
    events: &[EngineEvent],
    data_parallel_rank: Option<u32>,
    form: EventForm,
    hash_form: HashForm,
) -> Vec<u8> {
    let mut batch = vec![
        Value::F64(ts),
        Value::Array(
            events
                .iter()
                .map(|e| encode_event(e, form, hash_form))
                .collect(),
        ),
    ];
    if let Some(rank) = data_parallel_rank {
        batch.push(Value::from(rank));
    }
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &Value::Array(batch));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_round_trip() {
        let events = vec![
            EngineEvent::Stored(StoredBlocks {
                block_hashes: vec![u64::MAX - 1, 7],
                parent_block_hash: Some(1 << 63),
                token_ids: (0..8).collect(),
                block_size: 4,
                medium: Some("GPU".into()),
                group_idx: Some(0),
                ..Default::default()
            }),
            EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![7],
                medium: Some("CPU".into()),
                group_idx: None,
            }),
            EngineEvent::AllCleared,
        ];
        for form in [EventForm::Array, EventForm::Map] {
            for hash_form in [HashForm::Int, HashForm::Bytes] {
                let bytes = encode(1.5, &events, Some(3), form, hash_form);
                let batch = decode(&bytes).unwrap();
                assert_eq!(batch.events, events, "{form:?} {hash_form:?}");
                assert_eq!(batch.data_parallel_rank, Some(3));
                assert!(batch.malformed.is_empty());
            }
        }
    }

    #[test]
    fn bad_events_are_counted_not_fatal() {
        let bytes = {
            let mut out = Vec::new();
            let batch = Value::Array(vec![
                Value::F64(0.0),
                Value::Array(vec![
                    Value::from(5),
                    Value::Map(vec![(Value::from("type"), Value::from("BlockRemoved"))]),
                    Value::Map(vec![(Value::from("type"), Value::from("SomethingNew"))]),
                    Value::Array(vec![Value::from("AllBlocksCleared")]),
                ]),
            ]);
            rmpv::encode::write_value(&mut out, &batch).unwrap();
            out
        };
        let batch = decode(&bytes).unwrap();
        assert_eq!(batch.events, vec![EngineEvent::AllCleared]);
        assert_eq!(batch.malformed.len(), 2, "{:?}", batch.malformed);
        assert_eq!(batch.data_parallel_rank, None);
        assert!(decode(b"\x01").is_err());
        assert!(decode(&[]).is_err());
    }
}
