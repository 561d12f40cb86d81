//! The engine side of the KV-event protocol, as vLLM's `ZmqEventPublisher` does it: a PUB
//! socket sending `[topic, seq (8 bytes, big-endian), payload]` per batch, sequence from
//! 0, the last `buffer_steps` batches kept, and a ROUTER socket that answers
//! `[identity, "", start_seq]` with every buffered batch from `start_seq` on
//! (`[identity, "", topic, seq, payload]`, v0.26+), then the end marker (sequence all
//! 0xff, empty payload). Used by `engine-sim` and the tests.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{encode, EngineEvent, EventForm, HashForm};

/// What a publisher is told at start.
#[derive(Clone, Debug)]
pub struct PublisherSettings {
    /// Where the PUB socket binds, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// Where the replay ROUTER socket binds, if any.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub form: EventForm,
    pub hash_form: HashForm,
    pub data_parallel_rank: u32,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// Sequence numbers buffered but never sent live (a lost message, for tests).
    pub drop_sequences: Vec<u64>,
}

/// Sends batches to the publisher task.
#[derive(Clone)]
pub struct Publisher {
    batches: mpsc::UnboundedSender<Vec<EngineEvent>>,
    /// Where the PUB socket is bound (port 0 in the settings resolved).
    pub endpoint: String,
    /// Where the replay socket is bound, if any.
    pub replay_endpoint: Option<String>,
}

impl Publisher {
    /// Queues one batch (events of one engine step).
    pub fn publish(&self, events: Vec<EngineEvent>) {
        if !events.is_empty() {
            let _ = self.batches.send(events);
        }
    }
}

const END_SEQUENCE: [u8; 8] = [0xff; 8];

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("at least one frame")
}

/// Binds the sockets and starts the publisher task on the current tokio runtime.
pub async fn start(settings: PublisherSettings) -> std::io::Result<Publisher> {
    let mut publisher = zeromq::PubSocket::new();
    let endpoint = publisher
        .bind(&settings.endpoint)
        .await
        .map_err(|e| std::io::Error::other(format!("cannot bind {}: {e}", settings.endpoint)))?
        .to_string();
    let (mut replay, replay_endpoint) = match &settings.replay_endpoint {
        Some(endpoint) => {
            let mut socket = zeromq::RouterSocket::new();
            let bound = socket
                .bind(endpoint)
                .await
                .map_err(|e| std::io::Error::other(format!("cannot bind {endpoint}: {e}")))?;
            (Some(socket), Some(bound.to_string()))
        }
        None => (None, None),
    };
    let (batches, mut received) = mpsc::unbounded_channel::<Vec<EngineEvent>>();
    tokio::spawn(async move {
        let topic = Bytes::from(settings.topic.clone().into_bytes());
        let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
        let mut next_sequence = 0u64;
        loop {
            tokio::select! {
                events = received.recv() => {
                    let Some(events) = events else { return };
                    let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
                    let payload = Bytes::from(encode(ts, &events, Some(settings.data_parallel_rank), settings.form, settings.hash_form));
                    let sequence = next_sequence;
                    next_sequence += 1;
                    if !settings.drop_sequences.contains(&sequence) {
                        let frames = vec![topic.clone(), Bytes::copy_from_slice(&sequence.to_be_bytes()), payload.clone()];
                        let _ = publisher.send(message(frames)).await;
                    }
                    buffer.push_back((sequence, payload));
                    if buffer.len() > settings.buffer_steps {
                        buffer.pop_front();
                    }
                }
                request = async { replay.as_mut().expect("guarded").recv().await }, if replay.is_some() => {
                    let Ok(request) = request else { continue };
                    let frames = request.into_vec();
                    let [identity, _, start] = &frames[..] else { continue };
                    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else { continue };
                    let start = u64::from_be_bytes(start);
                    let socket = replay.as_mut().expect("guarded");
                    for (sequence, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
                        let frames = vec![identity.clone(), Bytes::new(), topic.clone(), Bytes::copy_from_slice(&sequence.to_be_bytes()), payload.clone()];
                        let _ = socket.send(message(frames)).await;
                    }
                    let end = vec![identity.clone(), Bytes::new(), Bytes::new(), Bytes::from_static(&END_SEQUENCE), Bytes::new()];
                    let _ = socket.send(message(end)).await;
                }
            }
        }
    });
    Ok(Publisher {
        batches,
        endpoint,
        replay_endpoint,
    })
}
