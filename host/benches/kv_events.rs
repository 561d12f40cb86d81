//! How fast the router takes in engine KV events: decode (vLLM's msgpack, map form, as
//! v0.24+ publishes it) plus hash agreement plus the KV index, per block event, on one
//! thread. A batch is 32 `BlockStored` events of 4 blocks of 16 tokens (a realistic
//! prefill step of a busy engine) followed by the 128 one-block `BlockRemoved` events that
//! evict them again, so the index stays the same size across iterations.
//!
//! `make bench-kv-events` (or `cargo bench -p switchyard --bench kv_events`).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use switchyard::config::ConfigSource;
use switchyard::fleet::kv_events::wire::{
    decode, encode, EngineEvent, EventForm, HashForm, RemovedBlocks, StoredBlocks,
};
use switchyard::fleet::router::Router;

const BLOCK: u32 = 16;

fn batches() -> (Vec<u8>, Vec<u8>, u64) {
    let mut stored = Vec::new();
    let mut removed = Vec::new();
    let mut blocks = 0;
    for event in 0..32u64 {
        let hashes: Vec<u64> = (0..4).map(|b| (event << 8 | b) | 1 << 63).collect();
        let tokens: Vec<u32> = (0..4 * BLOCK).map(|t| event as u32 * 1000 + t).collect();
        blocks += hashes.len() as u64;
        for &h in &hashes {
            removed.push(EngineEvent::Removed(RemovedBlocks {
                block_hashes: vec![h],
                medium: Some("GPU".into()),
                group_idx: Some(0),
            }));
        }
        stored.push(EngineEvent::Stored(StoredBlocks {
            block_hashes: hashes,
            parent_block_hash: None,
            token_ids: tokens,
            block_size: BLOCK,
            medium: Some("GPU".into()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            ..Default::default()
        }));
    }
    let encode =
        |events: &[EngineEvent]| encode(1.0, events, Some(0), EventForm::Map, HashForm::Int);
    (encode(&stored), encode(&removed), blocks * 2)
}

fn bench(c: &mut Criterion) {
    let yaml = "workers:\n  - {model: demo, worker_id: 1}\n";
    let source = ConfigSource::parse(yaml.into(), "<bench>".into(), ".".into()).unwrap();
    let router = Router::new(switchyard::startup::start(source).unwrap()).unwrap();
    let (stored, removed, block_events) = batches();
    let mut group = c.benchmark_group("kv_events");
    group.throughput(Throughput::Elements(block_events));
    group.bench_function("decode", |b| {
        b.iter(|| (decode(&stored).unwrap(), decode(&removed).unwrap()))
    });
    group.bench_function("decode+agree+index", |b| {
        b.iter(|| {
            for payload in [&stored, &removed] {
                let batch = decode(payload).unwrap();
                let outcome = router.apply_engine_events(1, 0, &batch.events);
                assert!(outcome.ignored.is_empty());
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
