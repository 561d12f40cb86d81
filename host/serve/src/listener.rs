//! The router's listeners: accept, admit under the connection limits, shake hands (TLS),
//! then hand each connection to HTTP (hyper, here) or gRPC (tonic, `ext_proc`).
//!
//! What one client can hold is bounded: connections per IP address, connections in all
//! (when full, the oldest connection with nothing in flight is closed for the new one, so idle sockets
//! cannot lock new clients out), the time to finish a TLS handshake and a request's
//! headers, and the time a connection may sit idle. Refusals are logged at most once a
//! second.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tower::ServiceExt;

use switchyard_config::HttpSettings;
use switchyard_engines::tls::ServerTls;

/// The limits of one listener.
#[derive(Clone, Debug)]
pub struct Limits {
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
}

impl Limits {
    /// The HTTP listener's limits; `open_files` is the process's open-file limit.
    pub fn http(settings: &HttpSettings, open_files: u64) -> Limits {
        let header = Duration::from_secs(settings.header_read_timeout_secs);
        Limits {
            handshake_timeout: header,
            header_read_timeout: header,
            idle_timeout: Duration::from_secs(settings.idle_timeout_secs),
            max_connections: settings.connection_cap(open_files),
            max_connections_per_peer: settings.max_connections_per_peer,
        }
    }
}

/// `idle_since_ms` of a connection that is busy (or already told to close).
const BUSY: u64 = u64::MAX;

/// One open connection as the table sees it.
pub struct ConnectionState {
    peer: IpAddr,
    in_flight: AtomicUsize,
    /// Requests the service took on this connection, ever.
    taken: AtomicU64,
    /// Milliseconds since the table's epoch when the last request ended; `BUSY` while one
    /// is in flight.
    idle_since_ms: AtomicU64,
    /// Told to close (evicted for a new connection).
    close: Notify,
}

impl crate::parse_errors::ServiceProgress for Arc<ConnectionState> {
    fn requests_taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
    fn responding(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }
}

impl ConnectionState {
    fn idle_for(&self, table: &ConnectionTable) -> Option<Duration> {
        let since = self.idle_since_ms.load(Ordering::Relaxed);
        (since != BUSY).then(|| Duration::from_millis(table.now_ms().saturating_sub(since)))
    }
}

/// A request in flight on a connection: the connection is not idle until it drops (at
/// the end of the response body).
struct InFlight {
    state: Arc<ConnectionState>,
    table: Arc<ConnectionTable>,
}

impl InFlight {
    fn begin(state: &Arc<ConnectionState>, table: &Arc<ConnectionTable>) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        state.taken.fetch_add(1, Ordering::Relaxed);
        state.idle_since_ms.store(BUSY, Ordering::Relaxed);
        InFlight {
            state: state.clone(),
            table: table.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.state.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.state
                .idle_since_ms
                .store(self.table.now_ms(), Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct Open {
    connections: HashMap<u64, Arc<ConnectionState>>,
    per_peer: HashMap<IpAddr, usize>,
    /// Connection ids, oldest admitted first: where eviction looks for an idle one.
    /// Ids of closed connections are skipped, and pruned when they pile up.
    order: VecDeque<u64>,
}

/// Connections an admission looks at for an idle one before refusing: the cost of an
/// admission stays constant however many connections are open and busy.
const EVICTION_SCAN: usize = 64;

/// Connections told to close for newer ones keep their socket until their task runs; at
/// most this many beyond the limit, so that when closes lag behind a flood the open
/// descriptors stay bounded. Past it the accept loop waits for the old ones to go (new
/// connections queue in the kernel's backlog meanwhile), up to `CLOSES_AWAITED`.
const CLOSING_AT_ONCE: usize = 64;

/// How long the accept loop waits for connections told to close before refusing.
const CLOSES_AWAITED: Duration = Duration::from_secs(1);

/// Every connection a listener holds open.
pub struct ConnectionTable {
    open: Mutex<Open>,
    next_id: AtomicU64,
    epoch: Instant,
    limits: Limits,
    name: &'static str,
    last_warning_ms: AtomicU64,
    refused: AtomicU64,
    /// Signalled when a connection closes while the table is past its limit.
    freed: Notify,
}

/// Why a connection was not admitted.
#[derive(Debug)]
enum Refused {
    PeerFull,
    Full,
    /// `CLOSING_AT_ONCE` connections told to close are still open: wait for them.
    ClosesPending,
}

/// A connection's place in the table, given back when it drops.
pub struct Slot {
    id: u64,
    state: Arc<ConnectionState>,
    table: Arc<ConnectionTable>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock();
        open.connections.remove(&self.id);
        if let Some(count) = open.per_peer.get_mut(&self.state.peer) {
            *count -= 1;
            if *count == 0 {
                open.per_peer.remove(&self.state.peer);
            }
        }
        if open.connections.len() >= self.table.limits.max_connections {
            self.table.freed.notify_one();
        }
    }
}

impl ConnectionTable {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Self> {
        Arc::new(ConnectionTable {
            open: Mutex::new(Open::default()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            limits,
            name,
            last_warning_ms: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            freed: Notify::new(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(BUSY - 1)
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.open.lock().connections.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections refused so far (per-peer or total limit, none idle to close).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Admits a connection from `peer`. When the table is full, the oldest connection
    /// with no request in flight is told to close for it (busy ones go to the back of
    /// the line); with none idle among the next `EVICTION_SCAN`, the new one is refused.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refused> {
        let peer = peer.to_canonical();
        let mut open = self.open.lock();
        if open.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.max_connections_per_peer {
            return Err(Refused::PeerFull);
        }
        if open.connections.len() >= self.limits.max_connections + CLOSING_AT_ONCE {
            // Those told to close have not yet: their sockets are still open.
            return Err(Refused::ClosesPending);
        }
        if open.connections.len() >= self.limits.max_connections {
            let victim = Self::evictable(&mut open).ok_or(Refused::Full)?;
            // Told once: it no longer counts as idle, so the next admission picks another.
            victim.idle_since_ms.store(BUSY, Ordering::Relaxed);
            victim.close.notify_one();
            tracing::debug!(
                listener = self.name,
                "closing an idle connection for a new one"
            );
        }
        if open.order.len() > 2 * open.connections.len() + EVICTION_SCAN {
            let Open {
                order, connections, ..
            } = &mut *open;
            order.retain(|id| connections.contains_key(id));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnectionState {
            peer,
            in_flight: AtomicUsize::new(0),
            taken: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
        });
        open.connections.insert(id, state.clone());
        open.order.push_back(id);
        *open.per_peer.entry(peer).or_default() += 1;
        Ok(Slot {
            id,
            state,
            table: self.clone(),
        })
    }

    /// Admits as `admit` does, but while connections told to close are still open past
    /// `CLOSING_AT_ONCE`, waits (up to `CLOSES_AWAITED`) for them to go rather than
    /// refusing: a client arriving during a flood gets its turn once closes catch up.
    async fn admit_when_closed(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refused> {
        let give_up = tokio::time::Instant::now() + CLOSES_AWAITED;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.admit(peer) {
                Err(Refused::ClosesPending) if tokio::time::Instant::now() < give_up => {
                    tokio::select! {
                        () = freed => {}
                        () = tokio::time::sleep_until(give_up) => {}
                    }
                }
                admitted => return admitted,
            }
        }
    }

    /// The oldest open connection without a request in flight, among the next few.
    fn evictable(open: &mut Open) -> Option<Arc<ConnectionState>> {
        for _ in 0..EVICTION_SCAN {
            let id = open.order.pop_front()?;
            let Some(connection) = open.connections.get(&id) else {
                continue; // closed already
            };
            if connection.idle_since_ms.load(Ordering::Relaxed) != BUSY {
                return Some(connection.clone());
            }
            open.order.push_back(id);
        }
        None
    }

    fn warn_refused(&self, peer: SocketAddr, why: &Refused) {
        let total = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.now_ms();
        let last = self.last_warning_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 1_000 && last != 0 {
            return;
        }
        self.last_warning_ms.store(now.max(1), Ordering::Relaxed);
        match why {
            Refused::PeerFull => {
                tracing::warn!(listener = self.name, peer = %peer.ip(), limit = self.limits.max_connections_per_peer, refused_so_far = total, "refusing connections: this address holds its limit (http.max_connections_per_peer)")
            }
            Refused::Full | Refused::ClosesPending => tracing::warn!(
                listener = self.name,
                limit = self.limits.max_connections,
                refused_so_far = total,
                "refusing connections: every connection is busy (http.max_connections)"
            ),
        }
    }
}

/// The stream of an admitted connection: plain TCP or TLS.
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An admitted connection, after its handshake.
pub struct Connection {
    io: Io,
    pub peer: SocketAddr,
    slot: Slot,
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = SocketAddr;
    fn connect_info(&self) -> SocketAddr {
        self.peer
    }
}

/// A bound listener with its limits and, optionally, TLS.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<Arc<ServerTls>>,
    table: Arc<ConnectionTable>,
}

impl Listener {
    pub fn new(tcp: TcpListener, tls: Option<Arc<ServerTls>>, table: Arc<ConnectionTable>) -> Self {
        Listener { tcp, tls, table }
    }

    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Accepts until `drain` turns true; each admitted connection shakes hands in a task
    /// of its own (a slow client never holds up the next accept) and is given to
    /// `connected`.
    pub async fn run(
        self,
        mut drain: watch::Receiver<bool>,
        connected: impl Fn(Connection) + Send + Sync + 'static,
    ) {
        let connected = Arc::new(connected);
        loop {
            let accepted = tokio::select! {
                accepted = self.tcp.accept() => accepted,
                _ = drain.wait_for(|d| *d) => return,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors (or a connection reset before accept): back off a
                    // little instead of spinning on the error.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let admitted = tokio::select! {
                admitted = self.table.admit_when_closed(peer.ip()) => admitted,
                _ = drain.wait_for(|d| *d) => return,
            };
            let slot = match admitted {
                Ok(slot) => slot,
                Err(why) => {
                    self.table.warn_refused(peer, &why);
                    drop(tcp);
                    continue;
                }
            };
            crate::socket::tune(&tcp);
            let tls = self.tls.as_ref().map(|t| t.current());
            let timeout = self.table.limits.handshake_timeout;
            let connected = connected.clone();
            tokio::spawn(async move {
                let io = match tls {
                    None => Io::Plain(tcp),
                    Some(config) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        let shaken = tokio::select! {
                            shaken = tokio::time::timeout(timeout, acceptor.accept(tcp)) => shaken,
                            () = slot.state.close.notified() => return,
                        };
                        match shaken {
                            Ok(Ok(stream)) => Io::Tls(Box::new(stream)),
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        }
                    }
                };
                connected(Connection { io, peer, slot });
            });
        }
    }
}

/// Serves HTTP on one connection until the client closes it, it sits idle past the
/// limit, it is evicted for a newer one, or the router drains.
pub async fn serve_http(
    connection: Connection,
    app: axum::Router,
    limits: Limits,
    mut drain: watch::Receiver<bool>,
) {
    let state = connection.slot.state.clone();
    let table = connection.slot.table.clone();
    let peer = connection.peer;
    let (service_state, service_table) = (state.clone(), table.clone());
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let app = app.clone();
            let in_flight = InFlight::begin(&service_state, &service_table);
            async move {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                let response = app
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|e: Infallible| match e {});
                // The connection is busy until the body (a stream, perhaps) has been sent.
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _ = &in_flight;
                        frame
                    }))
                }))
            }
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)));
    // hyper's own answers to requests it cannot parse get JSON bodies (parse_errors.rs).
    let io = TokioIo::new(crate::parse_errors::JsonParseErrors::new(
        connection,
        state.clone(),
    ));
    let serving = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(serving);
    let check = (limits.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = serving.as_mut() => return,
            () = state.close.notified(), if !closing => {
                // Evicted. With nothing in flight, drop it at once: a half-sent head
                // would hold off a graceful shutdown.
                if state.in_flight.load(Ordering::Relaxed) == 0 {
                    return;
                }
                serving.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = drain.wait_for(|d| *d), if !closing => {
                serving.as_mut().graceful_shutdown();
                closing = true;
            }
            () = tokio::time::sleep(check), if !closing => {
                if state.idle_for(&table).is_some_and(|idle| idle >= limits.idle_timeout) {
                    return;
                }
            }
        }
    }
}
