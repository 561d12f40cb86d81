//! Options of the sockets the router's listeners accept (HTTP, frontend, ext_proc).

/// Socket options of every connection a listener of the router accepts. Responses and
/// streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds each
/// back until the peer's delayed ACK (~40 ms).
pub fn tune(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("cannot set TCP_NODELAY on an accepted socket: {e}");
    }
}
