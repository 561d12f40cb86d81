//! One event of a batch, either form, read in place: its arrays (block hashes, token ids,
//! extra keys) are checked where they lie and decoded only as the event is handed on, in
//! parts of at most [`MAX_PART_BLOCKS`] blocks, so that one event of a million blocks
//! costs what a thousand small ones do.

use rmp::Marker;

use super::{digest, EngineEvent, Reader, RemovedBlocks, StoredBlocks};
use super::{REMOVED_FIELDS, STORED_FIELDS};

/// The most blocks (and, for `BlockStored`, at most [`MAX_PART_TOKENS`] tokens, but at
/// least one block) one decoded event holds. A larger event is handed on as consecutive
/// events of the same blocks, each part's parent the last block of the part before: the
/// same chain, as the hash agreement reads it.
pub const MAX_PART_BLOCKS: usize = 4096;
pub const MAX_PART_TOKENS: usize = 1 << 16;

/// An array checked in place; its elements decoded as the event is handed on.
#[derive(Clone, Copy)]
struct Lazy<'a> {
    /// At its first element not decoded yet.
    at: Reader<'a>,
    count: usize,
}

impl<'a> Lazy<'a> {
    /// Reads past an array, checking each element with `check`.
    fn read<T>(
        r: &mut Reader<'a>,
        check: impl Fn(&mut Reader<'a>) -> Result<T, String>,
    ) -> Result<Self, String> {
        let count = r.array_len()? as usize;
        let at = *r;
        for _ in 0..count {
            check(r)?;
        }
        Ok(Lazy { at, count })
    }

    /// The next `n` elements (fewer if fewer are left), decoded by `decode`; checked
    /// already, so a failure cannot happen (it would end the part early).
    fn take<T>(
        &mut self,
        n: usize,
        decode: impl Fn(&mut Reader<'a>) -> Result<T, String>,
    ) -> Vec<T> {
        let n = n.min(self.count);
        self.count -= n;
        (0..n).map_while(|_| decode(&mut self.at).ok()).collect()
    }
}

fn token(r: &mut Reader<'_>) -> Result<u32, String> {
    r.u32()
        .map_err(|e| format!("token ids must be integers < 2^32 ({e})"))
}

/// An extra key: 0 for none, else a digest of its encoded value.
fn extra_key(r: &mut Reader<'_>) -> Result<u64, String> {
    let start = r.0;
    Ok(if r.nil() { 0 } else { digest(r.raw(start)?) })
}

/// The fields of an event of either form, by name, before its tag decides what it is.
#[derive(Default)]
struct RawEvent<'a> {
    tag: Option<&'a str>,
    block_hashes: Option<Lazy<'a>>,
    parent_block_hash: Option<u64>,
    token_ids: Option<Lazy<'a>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    lora_name: Option<String>,
    medium: Option<String>,
    extra_keys: Option<Lazy<'a>>,
    group_idx: Option<i64>,
    kv_cache_spec_kind: Option<String>,
}

impl<'a> RawEvent<'a> {
    /// Reads the value of field `name` (unknown fields are skipped).
    fn field(&mut self, name: &str, r: &mut Reader<'a>) -> Result<(), String> {
        let with_name = |problem: String| format!("{name}: {problem}");
        if r.nil() {
            return Ok(()); // None: the field's default
        }
        match name {
            "block_hashes" => {
                self.block_hashes = Some(Lazy::read(r, Reader::hash).map_err(with_name)?)
            }
            "parent_block_hash" => self.parent_block_hash = Some(r.hash().map_err(with_name)?),
            "token_ids" => self.token_ids = Some(Lazy::read(r, token).map_err(with_name)?),
            "block_size" => {
                self.block_size = Some(
                    r.u32()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| with_name("must be an integer from 1 to 2^32-1".into()))?,
                )
            }
            "lora_id" => self.lora_id = Some(r.i64().map_err(with_name)?),
            "group_idx" => self.group_idx = Some(r.i64().map_err(with_name)?),
            "lora_name" => self.lora_name = Some(r.string().map_err(with_name)?),
            "medium" => self.medium = Some(r.string().map_err(with_name)?),
            "kv_cache_spec_kind" => self.kv_cache_spec_kind = Some(r.string().map_err(with_name)?),
            "extra_keys" => self.extra_keys = Some(Lazy::read(r, extra_key).map_err(with_name)?),
            _ => r.skip(0).map_err(with_name)?,
        }
        Ok(())
    }
}

/// An event read and checked, its arrays not decoded yet.
pub(super) struct Parsed<'a>(RawEvent<'a>, &'a str);

/// Reads one event, either form; None for a class this router does not know.
pub(super) fn read<'a>(r: &mut Reader<'a>) -> Result<Option<Parsed<'a>>, String> {
    let mut raw = RawEvent::default();
    match r.peek() {
        Some(Marker::FixArray(_) | Marker::Array16 | Marker::Array32) => {
            let n = r.array_len()?;
            if n == 0 {
                return Err("an empty positional event".into());
            }
            let tag = r
                .str()
                .map_err(|_| "a positional event must start with its class name".to_owned())?;
            raw.tag = Some(tag);
            let names: &[&str] = match tag {
                "BlockStored" => &STORED_FIELDS,
                "BlockRemoved" => &REMOVED_FIELDS,
                _ => &[],
            };
            for i in 0..(n - 1) as usize {
                match names.get(i) {
                    Some(name) => raw.field(name, r).map_err(|e| format!("{tag}: {e}"))?,
                    None => r.skip(0)?,
                }
            }
        }
        Some(Marker::FixMap(_) | Marker::Map16 | Marker::Map32) => {
            let n = r.map_len()?;
            for _ in 0..n {
                let key = r
                    .str()
                    .map_err(|_| "an event map key is not a string".to_owned())?;
                if key == "type" {
                    raw.tag = Some(
                        r.str()
                            .map_err(|_| "an event map whose `type` is not a string".to_owned())?,
                    );
                } else {
                    raw.field(key, r)
                        .map_err(|e| format!("{}: {e}", raw.tag.unwrap_or("event")))?;
                }
            }
        }
        _ => return Err("an event must be an array or a map".into()),
    }
    let tag = raw.tag.ok_or("an event map without a `type`")?;
    let missing = |field: &str| format!("{tag}: {field} is missing");
    match tag {
        "BlockStored" => {
            for (field, present) in [
                ("block_hashes", raw.block_hashes.is_some()),
                ("token_ids", raw.token_ids.is_some()),
                ("block_size", raw.block_size.is_some()),
            ] {
                if !present {
                    return Err(missing(field));
                }
            }
        }
        "BlockRemoved" if raw.block_hashes.is_none() => return Err(missing("block_hashes")),
        "BlockRemoved" | "AllBlocksCleared" => {}
        _ => return Ok(None),
    }
    Ok(Some(Parsed(raw, tag)))
}

/// Hands `event` on as one or more decoded events, in order.
pub(super) fn emit(Parsed(raw, tag): Parsed<'_>, out: &mut impl FnMut(EngineEvent)) {
    match tag {
        "BlockStored" => emit_stored(raw, out),
        "BlockRemoved" => {
            let mut hashes = raw.block_hashes.unwrap_or(EMPTY);
            loop {
                out(EngineEvent::Removed(RemovedBlocks {
                    block_hashes: hashes.take(MAX_PART_BLOCKS, Reader::hash),
                    medium: raw.medium.clone(),
                    group_idx: raw.group_idx,
                }));
                if hashes.count == 0 {
                    break;
                }
            }
        }
        _ => out(EngineEvent::AllCleared),
    }
}

const EMPTY: Lazy<'static> = Lazy {
    at: Reader(&[]),
    count: 0,
};

fn emit_stored(raw: RawEvent<'_>, out: &mut impl FnMut(EngineEvent)) {
    let mut hashes = raw.block_hashes.unwrap_or(EMPTY);
    let mut tokens = raw.token_ids.unwrap_or(EMPTY);
    let mut extra = raw.extra_keys.unwrap_or(EMPTY);
    let size = raw.block_size.unwrap_or(1) as usize;
    let template = StoredBlocks {
        parent_block_hash: raw.parent_block_hash,
        block_size: raw.block_size.unwrap_or(1),
        lora_id: raw.lora_id,
        lora_name: raw.lora_name,
        medium: raw.medium,
        group_idx: raw.group_idx,
        kv_cache_spec_kind: raw.kv_cache_spec_kind,
        ..Default::default()
    };
    if tokens.count != hashes.count.saturating_mul(size) {
        // Refused whole by the hash agreement (token_count): decoded only as far as shows
        // the same mismatch, never whole.
        let blocks = hashes.count.min(1);
        let want = match (blocks, tokens.count) {
            (0, _) => 1,
            (_, n) if n == size => size - 1,
            (_, n) => n.min(size + 1),
        };
        out(EngineEvent::Stored(StoredBlocks {
            block_hashes: hashes.take(blocks, Reader::hash),
            token_ids: tokens.take(want, token),
            ..template
        }));
        return;
    }
    let per_part = (MAX_PART_TOKENS / size).clamp(1, MAX_PART_BLOCKS);
    let mut parent = template.parent_block_hash;
    loop {
        let block_hashes = hashes.take(per_part, Reader::hash);
        let part = StoredBlocks {
            parent_block_hash: parent,
            token_ids: tokens.take(block_hashes.len() * size, token),
            extra_keys: extra.take(block_hashes.len(), extra_key),
            block_hashes,
            ..template.clone()
        };
        parent = part.block_hashes.last().copied().or(parent);
        out(EngineEvent::Stored(part));
        if hashes.count == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode, decode_events, encode, EventForm, HashForm};
    use super::*;

    #[test]
    fn a_large_stored_event_is_handed_on_in_chained_parts_of_the_same_blocks() {
        let blocks = 3 * MAX_PART_BLOCKS as u64 + 5;
        let stored = StoredBlocks {
            block_hashes: (1..=blocks).collect(),
            parent_block_hash: Some(1 << 40),
            token_ids: (0..blocks as u32 * 4).collect(),
            block_size: 4,
            medium: Some("GPU".into()),
            ..Default::default()
        };
        let payload = encode(
            1.0,
            &[EngineEvent::Stored(stored.clone())],
            None,
            EventForm::Map,
            HashForm::Int,
        );
        let parts = decode(&payload).unwrap().events;
        assert_eq!(parts.len(), 4);
        let (mut hashes, mut tokens, mut parent) =
            (Vec::new(), Vec::new(), stored.parent_block_hash);
        for part in parts {
            let EngineEvent::Stored(part) = part else {
                panic!("{part:?}")
            };
            assert!(part.block_hashes.len() <= MAX_PART_BLOCKS);
            assert_eq!(
                part.parent_block_hash, parent,
                "each part chained to the last"
            );
            assert_eq!(part.token_ids.len(), part.block_hashes.len() * 4);
            assert_eq!(part.medium.as_deref(), Some("GPU"));
            parent = part.block_hashes.last().copied();
            hashes.extend(part.block_hashes);
            tokens.extend(part.token_ids);
        }
        assert_eq!((hashes, tokens), (stored.block_hashes, stored.token_ids));
    }

    #[test]
    fn a_removal_of_a_million_one_byte_hashes_never_decodes_whole() {
        // [ts, [["BlockRemoved", [1, 1, ...]]]]: one byte a hash on the wire.
        let n: u32 = 1 << 20;
        let mut payload = vec![0x92, 0x00, 0x91, 0x92, 0xac];
        payload.extend_from_slice(b"BlockRemoved");
        payload.push(0xdd);
        payload.extend_from_slice(&n.to_be_bytes());
        payload.extend(std::iter::repeat_n(1u8, n as usize));
        let (mut largest, mut total) = (0, 0);
        decode_events(&payload, 0, |chunk| {
            for event in chunk {
                let EngineEvent::Removed(removed) = event else {
                    panic!()
                };
                largest = largest.max(removed.block_hashes.len());
                total += removed.block_hashes.len();
            }
        })
        .unwrap();
        assert_eq!((largest, total), (MAX_PART_BLOCKS, n as usize));
    }

    #[test]
    fn a_stored_event_whose_token_count_is_wrong_still_shows_it_without_decoding_it() {
        for (blocks, tokens) in [(3u64, 2 * 16u32), (3, 16), (0, 5), (2, 1000)] {
            let stored = StoredBlocks {
                block_hashes: (1..=blocks).collect(),
                token_ids: (0..tokens).collect(),
                block_size: 16,
                ..Default::default()
            };
            let payload = encode(
                1.0,
                &[EngineEvent::Stored(stored)],
                None,
                EventForm::Array,
                HashForm::Int,
            );
            let events = decode(&payload).unwrap().events;
            let [EngineEvent::Stored(part)] = &events[..] else {
                panic!("{events:?}")
            };
            assert!(part.block_hashes.len() <= 1 && part.token_ids.len() <= 17);
            assert_ne!(
                part.token_ids.len(),
                part.block_hashes.len() * 16,
                "{blocks} {tokens}"
            );
        }
    }

    #[test]
    fn an_array_declaring_four_billion_token_ids_is_refused_without_reserving_them() {
        // ["BlockStored", [1], nil, <array32 of 2^32 - 1, then nothing>]
        let mut payload = vec![0x92, 0x00, 0x91, 0x94, 0xab];
        payload.extend_from_slice(b"BlockStored");
        payload.extend_from_slice(&[0x91, 0x01, 0xc0, 0xdd, 0xff, 0xff, 0xff, 0xff]);
        assert!(decode(&payload).is_err());
    }
}
