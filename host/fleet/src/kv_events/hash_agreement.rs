//! Hash agreement: the engine names blocks with its own hashes (sha256 of its own keys),
//! the router names them with the chained hashes it computes for requests. From each
//! `BlockStored`'s token ids the router computes its own hash of every stored block,
//! chained from its parent, and keeps engine hash -> router hash per worker, so that a
//! `BlockRemoved` (which carries only engine hashes) finds its blocks.
//!
//! - The parent's router hash comes from this map; a parent the router never saw (events
//!   lost before it subscribed) makes the event unusable: counted, skipped.
//! - A LoRA adapter (`lora_name`, or the deprecated `lora_id`) seeds the chain, so adapter
//!   blocks never match base-model requests; per-block extra keys (multimodal inputs,
//!   cache salt) are mixed into that block's hash, so they never match plain text.
//! - The engine's `block_size` must equal the router's: blocks of another size name other
//!   prefixes. Events of another size are refused (counted, logged naming the worker).
//! - Hybrid models publish one group per KV-cache spec. Only full-attention groups
//!   (`full_attention`, `mla_attention`, or no kind given) describe reusable prefixes; the
//!   first such group a worker reports feeds the index, events of other groups are
//!   ignored, so groups never mix.

use rustc_hash::FxHashMap;

use super::wire::{EngineEvent, RemovedBlocks, StoredBlocks};
use crate::kv_index::{hash_block, mix, KvEvent, Tier, ROOT_HASH};

/// Why an engine event was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ignored {
    /// `block_size` differs from the router's.
    BlockSize,
    /// A parent block the router does not know.
    UnknownParent,
    /// `token_ids` is not `block_size` tokens per stored block.
    TokenCount,
    /// A medium this router does not know.
    UnknownMedium,
    /// A KV-cache group that does not feed the prefix index.
    OtherGroup,
}

impl Ignored {
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::BlockSize => "block_size",
            Ignored::UnknownParent => "unknown_parent",
            Ignored::TokenCount => "token_count",
            Ignored::UnknownMedium => "unknown_medium",
            Ignored::OtherGroup => "other_group",
        }
    }
}

/// The tier a `medium` names.
pub fn tier(medium: Option<&str>) -> Option<Tier> {
    match medium {
        None | Some("GPU") => Some(Tier::Device),
        Some("CPU") => Some(Tier::Host),
        Some("DISK" | "STORAGE") => Some(Tier::Disk),
        Some(_) => None,
    }
}

fn is_prefix_kind(kind: Option<&str>) -> bool {
    matches!(kind, None | Some("full_attention" | "mla_attention"))
}

/// One worker's engine blocks: engine hash -> (router hash, tiers holding it).
#[derive(Default)]
pub struct EngineBlocks {
    blocks: FxHashMap<u64, (u64, u8)>,
    /// The KV-cache group that feeds the index, once known.
    prefix_group: Option<i64>,
}

impl EngineBlocks {
    fn group_feeds_index(&mut self, group: Option<i64>, kind: Option<&str>) -> bool {
        let Some(group) = group else {
            return true;
        };
        match self.prefix_group {
            Some(prefix) => prefix == group,
            None if is_prefix_kind(kind) => {
                self.prefix_group = Some(group);
                true
            }
            None => false,
        }
    }

    /// Translates one engine event into the router's form (appended to `out`).
    pub fn translate(
        &mut self,
        event: &EngineEvent,
        router_block_size: u32,
        out: &mut Vec<KvEvent>,
    ) -> Result<(), Ignored> {
        match event {
            EngineEvent::Stored(stored) => self.stored(stored, router_block_size, out),
            EngineEvent::Removed(removed) => self.removed(removed, out),
            EngineEvent::AllCleared => {
                self.blocks.clear();
                out.push(KvEvent::Cleared { tier: None });
                Ok(())
            }
        }
    }

    fn stored(
        &mut self,
        s: &StoredBlocks,
        router_block_size: u32,
        out: &mut Vec<KvEvent>,
    ) -> Result<(), Ignored> {
        if !is_prefix_kind(s.kv_cache_spec_kind.as_deref())
            || !self.group_feeds_index(s.group_idx, s.kv_cache_spec_kind.as_deref())
        {
            return Err(Ignored::OtherGroup);
        }
        if s.block_size != router_block_size {
            return Err(Ignored::BlockSize);
        }
        let tier = tier(s.medium.as_deref()).ok_or(Ignored::UnknownMedium)?;
        let size = s.block_size as usize;
        if s.token_ids.len() != s.block_hashes.len() * size {
            return Err(Ignored::TokenCount);
        }
        let mut parent = match s.parent_block_hash {
            Some(engine) => self.blocks.get(&engine).ok_or(Ignored::UnknownParent)?.0,
            None => match (&s.lora_name, s.lora_id) {
                (Some(name), _) => mix(ROOT_HASH ^ hash_block(0, &name_tokens(name))),
                (None, Some(id)) => mix(ROOT_HASH ^ mix(id as u64 ^ 0x4c6f_5241)),
                (None, None) => ROOT_HASH,
            },
        };
        let bit = 1u8 << (tier as u8);
        let mut router_hashes = Vec::with_capacity(s.block_hashes.len());
        for (i, (&engine, tokens)) in s
            .block_hashes
            .iter()
            .zip(s.token_ids.chunks_exact(size))
            .enumerate()
        {
            let mut hash = hash_block(parent, tokens);
            if let Some(&extra) = s.extra_keys.get(i).filter(|&&e| e != 0) {
                hash = mix(hash ^ extra);
            }
            let entry = self.blocks.entry(engine).or_insert((hash, 0));
            *entry = (hash, entry.1 | bit);
            router_hashes.push(hash);
            parent = hash;
        }
        out.push(KvEvent::Stored {
            tier,
            parent_hash: None,
            block_hashes: router_hashes,
        });
        Ok(())
    }

    fn removed(&mut self, r: &RemovedBlocks, out: &mut Vec<KvEvent>) -> Result<(), Ignored> {
        if let (Some(group), Some(prefix)) = (r.group_idx, self.prefix_group) {
            if group != prefix {
                return Err(Ignored::OtherGroup);
            }
        }
        let tier = tier(r.medium.as_deref()).ok_or(Ignored::UnknownMedium)?;
        let bit = 1u8 << (tier as u8);
        let mut router_hashes = Vec::with_capacity(r.block_hashes.len());
        for engine in &r.block_hashes {
            let Some(entry) = self.blocks.get_mut(engine) else {
                continue; // stored before the router subscribed, or in another group
            };
            router_hashes.push(entry.0);
            entry.1 &= !bit;
            if entry.1 == 0 {
                self.blocks.remove(engine);
            }
        }
        if !router_hashes.is_empty() {
            out.push(KvEvent::Removed {
                tier,
                block_hashes: router_hashes,
            });
        }
        Ok(())
    }
}

/// A LoRA name as "tokens" for hashing.
fn name_tokens(name: &str) -> Vec<u32> {
    name.bytes().map(u32::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_index::hash_tokens;

    fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> EngineEvent {
        EngineEvent::Stored(StoredBlocks {
            block_hashes: hashes,
            parent_block_hash: parent,
            token_ids: tokens,
            block_size: 2,
            medium: Some("GPU".into()),
            ..Default::default()
        })
    }

    #[test]
    fn router_hashes_equal_request_hashes_across_events() {
        let tokens: Vec<u32> = (1..=6).collect();
        let mut expected = Vec::new();
        hash_tokens(&tokens, 2, &mut expected);
        let mut blocks = EngineBlocks::default();
        let mut out = Vec::new();
        // Two events: the second chains from the first through the engine's parent hash.
        blocks
            .translate(
                &stored(vec![100, 200], None, tokens[..4].to_vec()),
                2,
                &mut out,
            )
            .unwrap();
        blocks
            .translate(
                &stored(vec![300], Some(200), tokens[4..].to_vec()),
                2,
                &mut out,
            )
            .unwrap();
        let got: Vec<u64> = out
            .iter()
            .flat_map(|e| match e {
                KvEvent::Stored { block_hashes, .. } => block_hashes.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(got, expected);
        // Removal by engine hash finds the router hash.
        out.clear();
        let removed = EngineEvent::Removed(RemovedBlocks {
            block_hashes: vec![300],
            medium: None,
            group_idx: None,
        });
        blocks.translate(&removed, 2, &mut out).unwrap();
        assert_eq!(
            out,
            vec![KvEvent::Removed {
                tier: Tier::Device,
                block_hashes: vec![expected[2]]
            }]
        );
        assert_eq!(
            blocks.translate(&stored(vec![400], Some(999), vec![7, 8]), 2, &mut out),
            Err(Ignored::UnknownParent)
        );
        assert_eq!(
            blocks.translate(&stored(vec![400], None, vec![7, 8]), 4, &mut out),
            Err(Ignored::BlockSize)
        );
    }

    #[test]
    fn parts_chain_to_the_same_router_hashes_as_the_whole_event() {
        use crate::kv_events::wire::{decode, encode, EventForm, HashForm, MAX_PART_BLOCKS};
        let blocks = 2 * MAX_PART_BLOCKS as u64 + 100;
        let whole = EngineEvent::Stored(StoredBlocks {
            block_hashes: (1..=blocks).map(|h| h * 7919).collect(),
            token_ids: (0..blocks as u32 * 16).collect(),
            block_size: 16,
            ..Default::default()
        });
        let router_hashes = |events: &[EngineEvent]| {
            let (mut engine, mut out) = (EngineBlocks::default(), Vec::new());
            for event in events {
                engine.translate(event, 16, &mut out).unwrap();
            }
            out.into_iter()
                .flat_map(|e| match e {
                    KvEvent::Stored { block_hashes, .. } => block_hashes,
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<u64>>()
        };
        let payload = encode(
            1.0,
            std::slice::from_ref(&whole),
            None,
            EventForm::Array,
            HashForm::Bytes,
        );
        let parts = decode(&payload).unwrap().events;
        assert_eq!(parts.len(), 3);
        assert_eq!(router_hashes(&parts), router_hashes(&[whole]));
    }
}
