//! JSON bodies for the answers hyper makes itself. A request hyper cannot parse as
//! HTTP/1.1 (a bad request line or header line, bad framing, more than 100 headers or a
//! head over ~408 KiB, a URI over 65,534 bytes) never reaches a route: hyper answers it
//! with 400, 431 or 414 and an empty body, and closes the connection
//! (`hyper::proto::h1::role::Server::on_error`, which has no hook for a body). This
//! wrapper around the connection's socket recognizes exactly those heads as hyper writes
//! them (status line, `content-length: 0`, no `content-type`, the whole head in one write)
//! and sends them with a JSON body in the HTTP API's shape instead. Everything else
//! passes through untouched.
//!
//! A response body could hold those same bytes (an engine's answer echoing a prompt), and
//! rewriting it would add bytes its `content-length` does not cover: a proxy that shares
//! the connection between clients would read them as the next response. So a head is
//! only rewritten while the service has nothing under way: no request taken since the
//! last flush that found no response in progress (every byte of the responses before it
//! had been handed to the socket by then). hyper answers a parse error only in that
//! state, so its answers are always rewritten and a body never is.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// hyper's automatic answers: the status line it writes, and the body we send instead.
const AUTOMATIC: [(&[u8], &str, &str); 3] = [
    (
        b"HTTP/1.1 400 Bad Request\r\n",
        "malformed_request",
        "the request is not valid HTTP/1.1: its request line, a header line, or its framing (Content-Length, Transfer-Encoding) could not be parsed; see docs/http-api.md",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        "headers_too_large",
        "the request's headers are too many (more than 100) or too large (more than the 400 KiB or so the router buffers for a request line and its headers); send fewer or smaller headers",
    ),
    (
        b"HTTP/1.1 414 URI Too Long\r\n",
        "uri_too_long",
        "the request's URI is longer than 65,534 bytes; send what it carries in the body",
    ),
];

const EMPTY_LENGTH: &[u8] = b"\r\ncontent-length: 0\r\n";

/// What the connection's service has under way (read on the connection's own task).
pub trait ServiceProgress {
    /// Requests the service took on this connection, ever.
    fn requests_taken(&self) -> u64;
    /// Whether a response, its body included, is still being produced.
    fn responding(&self) -> bool;
}

/// A connection whose automatic error answers get JSON bodies.
pub struct JsonParseErrors<T, P> {
    inner: T,
    progress: P,
    /// `requests_taken` at the last flush that found no response in progress: every
    /// byte of those requests' responses was written before it.
    settled: u64,
    /// A rewritten answer not yet written whole, and how much of it was.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T, P: ServiceProgress> JsonParseErrors<T, P> {
    pub fn new(inner: T, progress: P) -> Self {
        JsonParseErrors {
            inner,
            progress,
            settled: 0,
            pending: None,
        }
    }

    /// Whether what is written now can only be hyper's own (no response under way).
    fn quiet(&self) -> bool {
        !self.progress.responding() && self.progress.requests_taken() == self.settled
    }
}

/// The answer to send instead of `head`, when `head` is one of hyper's automatic ones.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let (status_line, code, message) =
        AUTOMATIC.iter().find(|(line, ..)| head.starts_with(line))?;
    if !head.ends_with(b"\r\n\r\n") || contains(head, b"\r\ncontent-type:") {
        return None;
    }
    let at = find(head, EMPTY_LENGTH)?;
    let body = serde_json::json!({ "error": message, "code": code }).to_string();
    let mut answer = Vec::with_capacity(head.len() + body.len() + 64);
    answer.extend_from_slice(&head[..at]);
    answer.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
    answer.extend_from_slice(body.len().to_string().as_bytes());
    answer.extend_from_slice(b"\r\n");
    answer.extend_from_slice(&head[at + EMPTY_LENGTH.len()..]);
    answer.extend_from_slice(body.as_bytes());
    debug_assert!(answer.starts_with(status_line));
    Some(answer)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

impl<T: AsyncWrite + Unpin, P: ServiceProgress> JsonParseErrors<T, P> {
    /// Writes what is pending of a rewritten answer; ready when nothing is.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((answer, written)) = self.pending.as_mut() {
            if *written == answer.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &answer[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `head` as written when it is an automatic answer (its JSON form is sent by
    /// the next flush or write).
    fn intercept(&mut self, head: &[u8]) -> bool {
        if !self.quiet() {
            return false;
        }
        match rewrite(head) {
            Some(answer) => {
                self.pending = Some((answer, 0));
                true
            }
            None => false,
        }
    }
}

impl<T: AsyncRead + Unpin, P: Unpin> AsyncRead for JsonParseErrors<T, P> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin, P: ServiceProgress + Unpin> AsyncWrite for JsonParseErrors<T, P> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        if this.intercept(buf) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        // An automatic answer is a head alone: one slice with bytes in it.
        let mut filled = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next()) {
            if this.intercept(only) {
                return Poll::Ready(Ok(only.len()));
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        std::task::ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        // hyper flushes the socket only once its buffer is empty: with no response under
        // way, every byte of the responses so far has been written.
        if !this.progress.responding() {
            this.settled = this.progress.requests_taken();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use tokio::io::AsyncWriteExt;

    #[derive(Clone, Default)]
    struct Progress {
        taken: Rc<Cell<u64>>,
        responding: Rc<Cell<bool>>,
    }

    impl ServiceProgress for Progress {
        fn requests_taken(&self) -> u64 {
            self.taken.get()
        }
        fn responding(&self) -> bool {
            self.responding.get()
        }
    }

    const HEAD: &[u8] = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Thu, 03 Dec 2026 05:58:54 GMT\r\n\r\n";

    /// The same bytes as a response's body pass untouched, until the responses before
    /// are flushed with none under way.
    #[tokio::test(flavor = "current_thread")]
    async fn a_body_holding_the_same_bytes_is_never_rewritten() {
        let progress = Progress::default();
        let mut io = JsonParseErrors::new(Vec::new(), progress.clone());
        progress.taken.set(1);
        progress.responding.set(true);
        io.write_all(HEAD).await.unwrap();
        progress.responding.set(false);
        io.write_all(HEAD).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(
            io.inner,
            [HEAD, HEAD].concat(),
            "a response's bytes, as they came"
        );
        io.write_all(HEAD).await.unwrap();
        io.flush().await.unwrap();
        let answer = String::from_utf8_lossy(&io.inner[2 * HEAD.len()..]).into_owned();
        assert!(
            answer.ends_with("\"code\":\"malformed_request\"}"),
            "{answer}"
        );
    }

    #[test]
    fn only_hyper_automatic_heads_are_rewritten() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Thu, 03 Dec 2026 05:58:54 GMT\r\n\r\n";
        let answer = String::from_utf8(rewrite(head).unwrap()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("date: Thu") && head.contains("connection: close"));
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["code"], "headers_too_large");
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n";
        assert!(rewrite(with_body).is_none(), "our own answers pass");
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n").is_none());
    }
}
