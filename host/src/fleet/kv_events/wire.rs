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

use rmpv::{Integer, Value, ValueRef};

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

fn err(message: impl Into<String>) -> DecodeError {
    DecodeError(message.into())
}

/// Decodes one batch payload.
pub fn decode(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut reader = payload;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut reader, 16)
        .map_err(|e| err(format!("not msgpack: {e}")))?;
    let ValueRef::Array(fields) = value else {
        return Err(err(
            "a batch must be an array [ts, events, data_parallel_rank]",
        ));
    };
    let mut fields = fields.into_iter();
    let ts = match fields.next() {
        Some(ValueRef::F64(ts)) => ts,
        Some(ValueRef::F32(ts)) => f64::from(ts),
        Some(ValueRef::Integer(ts)) => ts.as_f64().unwrap_or(0.0),
        _ => return Err(err("a batch's first field (ts) must be a number")),
    };
    let Some(ValueRef::Array(raw_events)) = fields.next() else {
        return Err(err("a batch's second field (events) must be an array"));
    };
    let data_parallel_rank = match fields.next() {
        None | Some(ValueRef::Nil) => None,
        Some(ValueRef::Integer(rank)) => Some(
            rank.as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or_else(|| err(format!("data_parallel_rank {rank} is out of range")))?,
        ),
        Some(other) => {
            return Err(err(format!(
                "data_parallel_rank must be an integer, found {other}"
            )))
        }
    };
    let mut batch = Batch {
        ts,
        events: Vec::with_capacity(raw_events.len()),
        data_parallel_rank,
        malformed: Vec::new(),
    };
    for raw in raw_events {
        match event(raw) {
            Ok(Some(event)) => batch.events.push(event),
            Ok(None) => {} // a class this router does not know: newer vLLM
            Err(problem) => batch.malformed.push(problem),
        }
    }
    Ok(batch)
}

/// The fields of one event, by name, from either form.
struct Fields<'a> {
    tag: &'a str,
    pairs: Vec<(&'a str, ValueRef<'a>)>,
}

impl<'a> Fields<'a> {
    fn take(&mut self, name: &str) -> Option<ValueRef<'a>> {
        let at = self.pairs.iter().position(|(k, _)| *k == name)?;
        Some(self.pairs.swap_remove(at).1)
    }
}

fn fields<'a>(raw: ValueRef<'a>) -> Result<Fields<'a>, String> {
    match raw {
        ValueRef::Array(items) => {
            let mut items = items.into_iter();
            let tag = match items.next() {
                Some(ValueRef::String(tag)) => tag.into_str().ok_or("a non-UTF-8 event tag")?,
                _ => return Err("a positional event must start with its class name".into()),
            };
            let names: &[&str] = match tag {
                "BlockStored" => &STORED_FIELDS,
                "BlockRemoved" => &REMOVED_FIELDS,
                _ => &[],
            };
            Ok(Fields {
                tag,
                pairs: names.iter().copied().zip(items).collect(),
            })
        }
        ValueRef::Map(entries) => {
            let mut tag = None;
            let mut pairs = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                let ValueRef::String(key) = key else {
                    return Err("an event map key is not a string".into());
                };
                let key = key.into_str().ok_or("a non-UTF-8 event key")?;
                if key == "type" {
                    tag = match value {
                        ValueRef::String(t) => t.into_str(),
                        _ => None,
                    };
                } else {
                    pairs.push((key, value));
                }
            }
            Ok(Fields {
                tag: tag.ok_or("an event map without a string `type`")?,
                pairs,
            })
        }
        other => Err(format!("an event must be an array or a map, found {other}")),
    }
}

fn event(raw: ValueRef<'_>) -> Result<Option<EngineEvent>, String> {
    let mut f = fields(raw)?;
    let tag = f.tag;
    let with_tag = |problem: String| format!("{tag}: {problem}");
    match tag {
        "BlockStored" => {
            let block_hashes = hashes(f.take("block_hashes")).map_err(with_tag)?;
            let parent_block_hash = match f.take("parent_block_hash") {
                None | Some(ValueRef::Nil) => None,
                Some(v) => Some(hash(&v).map_err(with_tag)?),
            };
            let token_ids = match f.take("token_ids") {
                Some(ValueRef::Array(ids)) => ids
                    .iter()
                    .map(|id| match id {
                        ValueRef::Integer(i) => i.as_u64().and_then(|i| u32::try_from(i).ok()),
                        _ => None,
                    })
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| with_tag("token_ids must be integers < 2^32".into()))?,
                _ => return Err(with_tag("token_ids must be an array".into())),
            };
            let block_size = match f.take("block_size") {
                Some(ValueRef::Integer(n)) => n
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| with_tag(format!("block_size {n} is out of range")))?,
                _ => return Err(with_tag("block_size must be an integer".into())),
            };
            let extra_keys = match f.take("extra_keys") {
                Some(ValueRef::Array(keys)) => keys
                    .iter()
                    .map(|k| match k {
                        ValueRef::Nil => 0,
                        other => digest(other),
                    })
                    .collect(),
                _ => Vec::new(),
            };
            Ok(Some(EngineEvent::Stored(StoredBlocks {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id: int(f.take("lora_id")),
                lora_name: string(f.take("lora_name")),
                medium: string(f.take("medium")),
                extra_keys,
                group_idx: int(f.take("group_idx")),
                kv_cache_spec_kind: string(f.take("kv_cache_spec_kind")),
            })))
        }
        "BlockRemoved" => Ok(Some(EngineEvent::Removed(RemovedBlocks {
            block_hashes: hashes(f.take("block_hashes")).map_err(with_tag)?,
            medium: string(f.take("medium")),
            group_idx: int(f.take("group_idx")),
        }))),
        "AllBlocksCleared" => Ok(Some(EngineEvent::AllCleared)),
        _ => Ok(None),
    }
}

fn hash(value: &ValueRef<'_>) -> Result<u64, String> {
    match value {
        ValueRef::Integer(i) => i
            .as_u64()
            .ok_or_else(|| format!("block hash {i} is negative")),
        ValueRef::Binary(bytes) if bytes.len() >= 8 => {
            let tail: [u8; 8] = bytes[bytes.len() - 8..].try_into().expect("8 bytes");
            Ok(u64::from_be_bytes(tail))
        }
        other => Err(format!(
            "a block hash must be an integer or a digest of at least 8 bytes, found {other}"
        )),
    }
}

fn hashes(value: Option<ValueRef<'_>>) -> Result<Vec<u64>, String> {
    match value {
        Some(ValueRef::Array(items)) => items.iter().map(hash).collect(),
        _ => Err("block_hashes must be an array".into()),
    }
}

fn int(value: Option<ValueRef<'_>>) -> Option<i64> {
    match value {
        Some(ValueRef::Integer(i)) => i.as_i64(),
        _ => None,
    }
}

fn string(value: Option<ValueRef<'_>>) -> Option<String> {
    match value {
        Some(ValueRef::String(s)) => s.into_str().map(str::to_owned),
        _ => None,
    }
}

/// A stable digest of any msgpack value (FNV-1a over its encoding), never 0.
fn digest(value: &ValueRef<'_>) -> u64 {
    let mut bytes = Vec::new();
    let _ = rmpv::encode::write_value_ref(&mut bytes, value);
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for byte in bytes {
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
