//! Serving the HTTP API (and, beside it, the endpoint picker): binding the listeners,
//! refusing an exposed configuration, and draining on SIGTERM.

use super::*;

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called, not
/// when the future is first polled, so a signal right after startup is not lost.
#[cfg(unix)]
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {},
            _ = interrupt.recv() => {},
        }
        tracing::info!("shutting down: finishing requests in flight");
    })
}

#[cfg(not(unix))]
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down: finishing requests in flight");
    })
}

/// How `serve` listens.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// The Envoy endpoint picker's settings, when it is served.
    pub ext_proc: Option<ExtProcSettings>,
    /// Serve a non-loopback address without API keys (`serve --insecure`).
    pub insecure: bool,
}

/// Refuses to serve a non-loopback address that no credential guards, as Redis's
/// protected mode does: on a network, anyone who can reach the port could register a
/// worker and receive users' prompts.
fn check_exposure(options: &ServeOptions, generation: &Generation) -> std::io::Result<()> {
    let source = &generation.startup.source;
    let keyring = &generation.startup.keyring;
    if options.insecure || source.config.auth.insecure {
        return Ok(());
    }
    let exposed = |address: &SocketAddr| !address.ip().to_canonical().is_loopback();
    if exposed(&options.listen) && !keyring.has(switchyard_config::auth::Audience::Operator) {
        return Err(std::io::Error::other(format!(
            "{}: --listen {} is not a loopback address, and the config has no operator keys (auth.operators): anyone who can reach the port could register workers and receive users' prompts. Configure keys (docs/security.md), or pass --insecure (or set auth.insecure: true) on a lab network",
            source.name, options.listen
        )));
    }
    if let Some(ext_proc) = &options.ext_proc {
        let mutual_tls = ext_proc.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        if exposed(&ext_proc.listen)
            && !mutual_tls
            && !keyring.has(switchyard_config::auth::Audience::Client)
        {
            return Err(std::io::Error::other(format!(
                "{}: the endpoint picker's address {} is not loopback, and neither client keys (auth.clients) nor mutual TLS (ext_proc.tls.client_ca) guard it. Configure one (docs/security.md), or pass --insecure on a lab network",
                source.name, ext_proc.listen
            )));
        }
    }
    Ok(())
}

/// Connections the kernel queues for `accept` (clamped to `net.core.somaxconn`). std's
/// 128 overflows under a burst of new connections, and each overflow costs its client a
/// one-second SYN retransmit.
const ACCEPT_BACKLOG: u32 = 4096;

/// Binds `listen`; the error says which listener and what to do.
pub async fn bind(
    listen: SocketAddr,
    what: &str,
    option: &str,
) -> std::io::Result<tokio::net::TcpListener> {
    let bound = (|| {
        let socket = match listen {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(listen)?;
        socket.listen(ACCEPT_BACKLOG)
    })();
    bound.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {listen} for {what}: {e}; pick another {option} address"),
        )
    })
}

/// Every address a listener bound to `address` answers on: a wildcard bind answers on
/// loopback and on each of the machine's interface addresses.
fn answering_addresses(address: SocketAddr) -> Vec<SocketAddr> {
    if !address.ip().is_unspecified() {
        return vec![address];
    }
    let mut ips: Vec<std::net::IpAddr> = vec![
        std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::Ipv6Addr::LOCALHOST.into(),
        address.ip(),
    ];
    if let Ok(interfaces) = nix::ifaddrs::getifaddrs() {
        ips.extend(interfaces.filter_map(|i| {
            let a = i.address?;
            a.as_sockaddr_in()
                .map(|v4| std::net::IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
        }));
    }
    ips.into_iter()
        .map(|ip| SocketAddr::new(ip, address.port()))
        .collect()
}

/// The open-file limit in force (the binary raises it to the hard limit first).
fn open_file_limit() -> u64 {
    rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
}

/// The listeners' TLS (`http.tls`, `ext_proc.tls`), kept to swap certificates on reload.
fn listener_tls(
    source: &switchyard_config::ConfigSource,
    options: &ServeOptions,
) -> std::io::Result<ListenerTls> {
    let config = &source.config;
    let server_tls = |section: &str,
                      settings: Option<&switchyard_config::TlsSettings>,
                      alpn: &[&[u8]]| {
        settings
            .map(|t| {
                switchyard_engines::tls::server_config(section, t, source, alpn).map(ServerTls::new)
            })
            .transpose()
            .map_err(std::io::Error::other)
    };
    Ok(ListenerTls {
        http: server_tls(
            "http.tls",
            config.http.tls.as_ref(),
            switchyard_engines::tls::HTTP_ALPN,
        )?,
        ext_proc: server_tls(
            "ext_proc.tls",
            options.ext_proc.as_ref().and_then(|e| e.tls.as_ref()),
            switchyard_engines::tls::GRPC_ALPN,
        )?,
    })
}

/// Everything that runs beside the listeners: engine scrapes, KV-event subscriptions,
/// reload on SIGHUP, the replicas' bus.
async fn start_background(router: &Arc<Router>, listener_tls: &ListenerTls) -> std::io::Result<()> {
    switchyard_engines::engine_metrics::start(router.clone())?;
    router.subscribe_kv_events(&router.workers())?;
    crate::reload::on_hangup(router.clone(), listener_tls.clone())?;
    if let Some((id, nats)) = start_replicas(router).await? {
        println!("switchyard replica {id} sharing load over {nats}");
    }
    Ok(())
}

/// Joins the replicas' bus when the config has `replicas:` (the others' bookings are in
/// before this returns, so before the host serves): this replica's id and the bus.
pub async fn start_replicas(router: &Arc<Router>) -> std::io::Result<Option<(String, String)>> {
    let Some(settings) = router.generation().config().replicas.clone() else {
        return Ok(None);
    };
    let token = settings
        .token_file
        .as_ref()
        .map(|f| router.generation().startup.source.resolve(f));
    let nats = settings.nats.clone();
    let id = switchyard_fleet::replicas::start(router.clone(), settings, token)
        .await
        .map_err(std::io::Error::other)?;
    Ok(Some((id, nats)))
}

/// Releases reservations nothing freed, once a second.
pub async fn expire_forever(expiry: Arc<Router>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let router = expiry.clone();
        // Takes the load lock for writing: off the executor, like every lock a
        // selection may hold.
        let expired = tokio::task::spawn_blocking(move || router.expire())
            .await
            .unwrap_or(0);
        if expired > 0 {
            tracing::warn!(expired, "released reservations that were never freed");
        }
    }
}

/// A flag that turns true at SIGINT or SIGTERM.
fn drain_on_signal() -> std::io::Result<tokio::sync::watch::Receiver<bool>> {
    let shutdown = shutdown_signal()?;
    let (drain, draining) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = drain.send(true);
    });
    Ok(draining)
}

/// Starts the endpoint picker on its own listener and a runtime of its own
/// (`ext_proc.threads`), so that a stream's messages are not handed between the HTTP
/// service's threads: with one thread, a stream's connection and its handler share it
/// and no message wakes another (docs/BENCHMARKS.md, the picker's system calls). The
/// receiver resolves when the picker has drained. Its errors end the whole process: an
/// operator who asked for the picker must not get a router without it.
fn start_picker(
    frontend: &Arc<Frontend>,
    settings: &switchyard_config::ExtProcSettings,
    tcp: tokio::net::TcpListener,
    tls: Option<Arc<switchyard_engines::tls::ServerTls>>,
    table: Arc<ConnectionTable>,
    draining: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let picker = EndpointPicker::new(frontend.clone(), settings);
    // The socket moves to the picker's runtime: it is registered with that one's reactor.
    let tcp = tcp.into_std()?;
    let mut runtime = if settings.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(settings.threads));
        builder
    };
    let runtime = runtime
        .enable_all()
        .thread_name("ext-proc")
        .build()
        .map_err(|e| std::io::Error::other(format!("cannot start the picker's runtime: {e}")))?;
    let (done, drained) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("ext-proc".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                let listener = Listener::new(tokio::net::TcpListener::from_std(tcp)?, tls, table);
                ext_proc::serve(picker, listener, draining).await
            });
            // Waits for the picker's blocking threads: the drain is over only when no
            // selection of it still runs plugin code (the process exits next).
            drop(runtime);
            if let Err(e) = served {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            let _ = done.send(());
        })?;
    Ok(drained)
}

/// Accepts HTTP connections until the drain starts, then waits for what is in flight
/// (and the picker) up to `drain_timeout`.
async fn serve_until_drained(
    listener: Listener,
    app: axum::Router,
    limits: Limits,
    table: Arc<ConnectionTable>,
    picker: Option<tokio::sync::oneshot::Receiver<()>>,
    draining: tokio::sync::watch::Receiver<bool>,
    drain_timeout: Duration,
) -> std::io::Result<()> {
    let drained = |mut draining: tokio::sync::watch::Receiver<bool>| async move {
        let _ = draining.wait_for(|&d| d).await;
    };
    let connection_drain = draining.clone();
    let deadline_drain = draining.clone();
    let http = async move {
        listener
            .run(draining.clone(), move |connection| {
                let (app, limits, drain) = (app.clone(), limits.clone(), connection_drain.clone());
                tokio::spawn(crate::listener::serve_http(connection, app, limits, drain));
            })
            .await;
        // Accepting stopped: each connection closes once its requests are answered.
        while !table.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let both = async {
        http.await;
        if let Some(picker) = picker {
            let _ = picker.await;
        }
        Ok(())
    };
    tokio::pin!(both);
    tokio::select! {
        served = &mut both => served,
        () = async {
            drained(deadline_drain).await;
            tokio::time::sleep(drain_timeout).await;
        } => {
            tracing::warn!(seconds = drain_timeout.as_secs(), "drain deadline reached (router.drain_timeout_secs): ending with requests still in flight");
            Ok(())
        }
    }
}

/// Serves until SIGINT or SIGTERM. Prints `switchyard listening on http://ADDR` (or
/// https) once bound.
pub async fn serve(router: Arc<Router>, options: ServeOptions) -> std::io::Result<()> {
    switchyard_engines::tls::install_default_provider();
    let generation = router.generation();
    check_exposure(&options, &generation)?;
    let source = &generation.startup.source;
    let config = &source.config;
    let tcp = bind(options.listen, "the HTTP service", "--listen").await?;
    let address = tcp.local_addr()?;
    let listener_tls = listener_tls(source, &options)?;
    let limits = Limits::http(&config.http, open_file_limit());
    let body_limits = BodyLimits {
        max_bytes: config.http.max_body_bytes,
        read_timeout: Duration::from_secs(config.http.body_read_timeout_secs),
    };
    let drain_timeout = Duration::from_secs(config.router.drain_timeout_secs);
    let ext_proc_tcp = match &options.ext_proc {
        Some(settings) => Some(bind(settings.listen, "ext_proc", "--ext-proc").await?),
        None => None,
    };
    let mut own = answering_addresses(address);
    if let Some(tcp) = &ext_proc_tcp {
        own.extend(answering_addresses(tcp.local_addr()?));
    }
    drop(generation);
    // Host names are resolved to be compared: on the blocking pool, not the executor.
    let checking = router.clone();
    tokio::task::spawn_blocking(move || checking.set_own_addresses(own))
        .await
        .map_err(std::io::Error::other)?
        .map_err(|e| std::io::Error::other(format!("in `workers:` of the config: {e}")))?;
    // SIGTERM or SIGINT starts the drain: every listener stops accepting, what is in
    // flight finishes (up to `router.drain_timeout_secs`), then the process ends.
    let draining = drain_on_signal()?;
    let frontend = Frontend::new(router.clone()).map_err(std::io::Error::other)?;
    tokio::spawn(switchyard_engines::health::probe_forever(
        frontend.router().clone(),
        frontend.clients().clone(),
    ));
    // Pods of an InferencePool join and leave the fleet (docs/kubernetes.md).
    switchyard_discovery::start(router.clone())
        .await
        .map_err(std::io::Error::other)?;
    start_background(&router, &listener_tls).await?;
    let scheme = if listener_tls.http.is_some() {
        "https"
    } else {
        "http"
    };
    println!("switchyard listening on {scheme}://{address}");
    let picker = match (options.ext_proc, ext_proc_tcp) {
        (Some(settings), Some(tcp)) => {
            let table = ConnectionTable::new("ext_proc", limits.clone());
            Some(start_picker(
                &frontend,
                &settings,
                tcp,
                listener_tls.ext_proc.clone(),
                table,
                draining.clone(),
            )?)
        }
        _ => None,
    };
    tokio::spawn(expire_forever(router.clone()));
    let table = ConnectionTable::new("http", limits.clone());
    let listener = Listener::new(tcp, listener_tls.http.clone(), table.clone());
    let finishing = router.clone();
    let app = app(router, frontend, body_limits).layer(Extension(listener_tls));
    let served = serve_until_drained(
        listener,
        app,
        limits,
        table,
        picker,
        draining,
        drain_timeout,
    )
    .await;
    // The process exits next, running its libraries' destructors (a C++ plugin's static
    // objects among them): first the notifications still queued are delivered and the
    // retired plugin state dropped, and the threads that run them stop.
    let _ =
        tokio::task::spawn_blocking(move || finishing.finish_plugin_threads(PLUGIN_THREADS_FINISH))
            .await;
    served
}

/// How long shutdown waits for retired plugin state that selections still hold.
const PLUGIN_THREADS_FINISH: Duration = Duration::from_secs(5);
