//! The subscriber's side of ZeroMQ's wire protocol (ZMTP 3.0, NULL security), read with
//! limits: a SUB socket for the live stream and a DEALER socket for replay, one TCP
//! connection each.
//!
//! Why not the `zeromq` crate the publisher side uses: its decoder (0.6) reserves each
//! frame's declared length (a 64-bit number from the peer) before a byte of it has
//! arrived, keeps a multipart message whole however many frames it has, and offers no
//! setting to bound either; one frame declaring a terabyte makes the allocator abort the
//! process. Here a frame's length is compared with the limit before anything is
//! allocated; a message over it is read past in 64 KiB steps (nothing of it kept) and
//! reported, and the connection goes on with the next message.

use std::io::{Error, ErrorKind};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Frames a message of the KV-event protocol may have (a replay reply has four; a few
/// spare for later versions). A message with more is dropped as oversized.
const MAX_FRAMES: usize = 8;
/// The largest command (READY, heartbeats) read; a peer sending a larger one is not a
/// publisher.
const MAX_COMMAND: u64 = 64 << 10;

const FLAG_MORE: u8 = 1;
const FLAG_LONG: u8 = 2;
const FLAG_COMMAND: u8 = 4;

/// One message received.
#[derive(Debug)]
pub(super) enum Received {
    /// Its frames, together at most the limit.
    Message(Vec<Bytes>),
    /// A message over the limit (its frames' declared sizes together), read past.
    Oversized { bytes: u64 },
}

/// A connection to a publisher's socket.
pub(super) struct Peer {
    stream: BufReader<TcpStream>,
}

fn invalid(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidData, what.into())
}

impl Peer {
    /// Connects to `endpoint` (`tcp://host:port`) as a socket of `socket_type` (`SUB`,
    /// `DEALER`) and completes the handshake.
    pub(super) async fn connect(endpoint: &str, socket_type: &str) -> std::io::Result<Peer> {
        let address = endpoint
            .strip_prefix("tcp://")
            .ok_or_else(|| invalid(format!("`{endpoint}` is not tcp://host:port")))?;
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let mut peer = Peer {
            stream: BufReader::new(stream),
        };
        peer.greet().await?;
        peer.ready(socket_type).await?;
        Ok(peer)
    }

    /// Exchanges greetings: signature, version 3.0, the NULL mechanism, client role.
    async fn greet(&mut self) -> std::io::Result<()> {
        let mut greeting = [0u8; 64];
        greeting[0] = 0xff;
        greeting[9] = 0x7f;
        greeting[10] = 3;
        greeting[12..16].copy_from_slice(b"NULL");
        self.stream.get_mut().write_all(&greeting).await?;
        let mut theirs = [0u8; 64];
        self.stream.read_exact(&mut theirs).await?;
        if theirs[0] != 0xff || theirs[9] & 1 != 1 {
            return Err(invalid("not a ZeroMQ peer (bad greeting signature)"));
        }
        if theirs[10] < 3 {
            return Err(invalid(format!(
                "a ZeroMQ peer of protocol version {}; 3 or later is needed",
                theirs[10]
            )));
        }
        if &theirs[12..32] != b"NULL\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0" {
            return Err(invalid(
                "the peer wants a security mechanism other than NULL",
            ));
        }
        Ok(())
    }

    /// Sends READY with our socket type and waits for the peer's.
    async fn ready(&mut self, socket_type: &str) -> std::io::Result<()> {
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        body.push(11);
        body.extend_from_slice(b"Socket-Type");
        body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
        body.extend_from_slice(socket_type.as_bytes());
        let mut command = vec![FLAG_COMMAND, body.len() as u8];
        command.extend_from_slice(&body);
        self.stream.get_mut().write_all(&command).await?;
        let (flags, len) = self.frame_head().await?;
        if flags & FLAG_COMMAND == 0 || len > MAX_COMMAND {
            return Err(invalid("the peer did not answer READY"));
        }
        let mut theirs = vec![0; len as usize];
        self.stream.read_exact(&mut theirs).await?;
        if !theirs.starts_with(b"\x05READY") {
            return Err(invalid("the peer refused the handshake"));
        }
        Ok(())
    }

    /// Subscribes (a SUB socket) to messages starting with `topic`.
    pub(super) async fn subscribe(&mut self, topic: &[u8]) -> std::io::Result<()> {
        let mut subscription = Vec::with_capacity(topic.len() + 1);
        subscription.push(1);
        subscription.extend_from_slice(topic);
        self.send(&[&subscription]).await
    }

    /// Sends one message of `frames`.
    pub(super) async fn send(&mut self, frames: &[&[u8]]) -> std::io::Result<()> {
        let mut out = Vec::new();
        for (i, frame) in frames.iter().enumerate() {
            let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
            if frame.len() > 255 {
                out.push(more | FLAG_LONG);
                out.extend_from_slice(&(frame.len() as u64).to_be_bytes());
            } else {
                out.push(more);
                out.push(frame.len() as u8);
            }
            out.extend_from_slice(frame);
        }
        let stream = self.stream.get_mut();
        stream.write_all(&out).await?;
        stream.flush().await
    }

    /// A frame's flags and declared length.
    async fn frame_head(&mut self) -> std::io::Result<(u8, u64)> {
        let flags = self.stream.read_u8().await?;
        let len = if flags & FLAG_LONG != 0 {
            self.stream.read_u64().await?
        } else {
            u64::from(self.stream.read_u8().await?)
        };
        Ok((flags, len))
    }

    /// Reads past `len` bytes in bounded steps, keeping none.
    async fn discard(&mut self, len: u64) -> std::io::Result<()> {
        let mut rest = (&mut self.stream).take(len);
        let copied = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await?;
        if copied < len {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                "the peer closed inside a frame",
            ));
        }
        Ok(())
    }

    /// The next message, if its frames together have at most `limit` bytes; otherwise
    /// it is read past and reported. Commands between messages (heartbeats) are skipped.
    /// Not cancel-safe: a connection whose receive was dropped must be connected afresh.
    pub(super) async fn recv(&mut self, limit: usize) -> std::io::Result<Received> {
        let mut frames = Vec::new();
        let (mut total, mut count, mut over) = (0u64, 0usize, false);
        loop {
            let (flags, len) = self.frame_head().await?;
            if flags & FLAG_COMMAND != 0 {
                if len > MAX_COMMAND || count > 0 {
                    return Err(invalid("a command too large, or inside a message"));
                }
                self.discard(len).await?;
                continue;
            }
            count += 1;
            total = total.saturating_add(len);
            if !over && (total > limit as u64 || count > MAX_FRAMES) {
                over = true;
                frames = Vec::new(); // what was kept of it goes at once
            }
            if over {
                self.discard(len).await?;
            } else {
                // At most `limit` bytes: the length was checked before this allocation.
                let mut frame = vec![0; len as usize];
                self.stream.read_exact(&mut frame).await?;
                frames.push(Bytes::from(frame));
            }
            if flags & FLAG_MORE == 0 {
                return Ok(if over {
                    Received::Oversized { bytes: total }
                } else {
                    Received::Message(frames)
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A peer that greets, answers READY, then writes `then` and waits for the other
    /// side to close (or, `hang_up`, closes itself).
    async fn fake_publisher(then: Vec<u8>, hang_up: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut greeting = [0u8; 64];
            greeting[0] = 0xff;
            greeting[9] = 0x7f;
            greeting[10] = 3;
            greeting[12..16].copy_from_slice(b"NULL");
            socket.write_all(&greeting).await.unwrap();
            let ready = b"\x04\x19\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB";
            socket.write_all(ready).await.unwrap();
            socket.write_all(&then).await.unwrap();
            if hang_up {
                // Our greeting and READY (a SUB's) read first: closing with them unread
                // would reset the connection before the handshake ends.
                let mut ours = [0u8; 64 + 27];
                socket.read_exact(&mut ours).await.unwrap();
                return;
            }
            let mut sink = Vec::new();
            let _ = socket.read_to_end(&mut sink).await;
        });
        format!("tcp://{address}")
    }

    fn frame(more: bool, data: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::from(more) | FLAG_LONG];
        out.extend_from_slice(&(data.len() as u64).to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    #[tokio::test]
    async fn a_frame_declaring_more_than_the_limit_is_never_allocated() {
        // A frame declaring 2^62 bytes, of which 3 arrive: nothing is reserved for it.
        let mut bytes = vec![FLAG_LONG];
        bytes.extend_from_slice(&(1u64 << 62).to_be_bytes());
        bytes.extend_from_slice(b"abc");
        let endpoint = fake_publisher(bytes, true).await;
        let mut peer = Peer::connect(&endpoint, "SUB").await.unwrap();
        let read = peer.recv(1 << 20).await.unwrap_err();
        assert_eq!(read.kind(), ErrorKind::UnexpectedEof, "{read}");
    }

    #[tokio::test]
    async fn an_oversized_message_is_read_past_and_the_next_one_received() {
        let mut bytes = frame(true, b"topic");
        bytes.extend(frame(false, &vec![7; 100_000]));
        bytes.extend(frame(true, b"topic"));
        bytes.extend(frame(true, &5u64.to_be_bytes()));
        bytes.extend(frame(false, b"payload"));
        let endpoint = fake_publisher(bytes, false).await;
        let mut peer = Peer::connect(&endpoint, "SUB").await.unwrap();
        let first = peer.recv(50_000).await.unwrap();
        assert!(
            matches!(first, Received::Oversized { bytes: 100_005 }),
            "{first:?}"
        );
        let Received::Message(frames) = peer.recv(50_000).await.unwrap() else {
            panic!("the next message");
        };
        assert_eq!(frames.len(), 3);
        assert_eq!(&frames[2][..], b"payload");
    }

    #[tokio::test]
    async fn random_streams_are_read_within_the_limit_or_refused() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(46);
        for _ in 0..200 {
            // Frame heads with small, large and absurd lengths, bodies of random bytes
            // (shorter than declared at times), commands among them.
            let mut bytes = Vec::new();
            for _ in 0..rng.gen_range(1..12) {
                let flags = rng.gen_range(0u8..8);
                let len: u64 = match rng.gen_range(0..4) {
                    0 => rng.gen_range(0..64),
                    1 => rng.gen_range(0..5000),
                    2 => rng.gen(),
                    _ => 1 << rng.gen_range(10..63),
                };
                bytes.push(flags | FLAG_LONG);
                bytes.extend_from_slice(&len.to_be_bytes());
                let body = len.min(rng.gen_range(0..3000));
                bytes.extend((0..body).map(|_| rng.gen::<u8>()));
            }
            let endpoint = fake_publisher(bytes, true).await;
            let mut peer = Peer::connect(&endpoint, "SUB").await.unwrap();
            while let Ok(received) = peer.recv(2048).await {
                if let Received::Message(frames) = received {
                    assert!(frames.len() <= MAX_FRAMES);
                    assert!(frames.iter().map(|f| f.len()).sum::<usize>() <= 2048);
                }
            }
        }
    }
}
