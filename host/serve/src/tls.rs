//! TLS with rustls (the ring provider): the listeners' server configs, read from the
//! config's PEM files and swapped on reload, and the client config for `https://`
//! engines. Every error names the setting and the file.

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use switchyard_config::{ConfigSource, TlsSettings};

/// What the HTTP listener offers over TLS: HTTP/2, then HTTP/1.1.
pub const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// What the gRPC listener offers: HTTP/2 only.
pub const GRPC_ALPN: &[&[u8]] = &[b"h2"];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default provider: the one reqwest and tonic use for
/// anything not configured here. Idempotent.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn certificates(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{setting} {shown}: cannot read it: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{setting} {shown}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} {shown}: no certificate in it (expected PEM blocks `-----BEGIN CERTIFICATE-----`)"
        ));
    }
    Ok(certs)
}

fn roots(setting: &str, path: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(setting, path)? {
        roots.add(cert).map_err(|e| {
            format!(
                "{setting} {}: not a usable CA certificate: {e}",
                path.display()
            )
        })?;
    }
    Ok(roots)
}

/// The server config of one listener (`section`: `http.tls` or `ext_proc.tls`), with
/// the ALPN protocols it offers.
pub fn server_config(
    section: &str,
    settings: &TlsSettings,
    source: &ConfigSource,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, String> {
    let client_ca = settings.client_ca.as_ref().map(|ca| source.resolve(ca));
    server_config_from_files(
        section,
        &source.resolve(&settings.cert),
        &source.resolve(&settings.key),
        client_ca.as_deref(),
        alpn,
    )
}

/// `server_config` from the files themselves.
pub fn server_config_from_files(
    section: &str,
    cert_path: &Path,
    key_path: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = certificates(&format!("{section}.cert"), cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
        format!(
            "{section}.key {}: no private key read from it ({e}); expected a PEM `PRIVATE KEY` block",
            key_path.display()
        )
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("{section}: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let setting = format!("{section}.client_ca");
            let roots = roots(&setting, ca)?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .build()
            .map_err(|e| format!("{setting}: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        format!(
            "{section}: the key {} does not fit the certificate {}: {e}",
            key_path.display(),
            cert_path.display()
        )
    })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A listener's TLS config, replaced whole by a reload; connections keep the one they
/// shook hands with.
pub struct ServerTls {
    current: RwLock<Arc<rustls::ServerConfig>>,
}

impl ServerTls {
    pub fn new(config: Arc<rustls::ServerConfig>) -> Arc<Self> {
        Arc::new(ServerTls {
            current: RwLock::new(config),
        })
    }

    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current.read().clone()
    }

    pub fn replace(&self, config: Arc<rustls::ServerConfig>) {
        *self.current.write() = config;
    }
}

/// The client config for `https://` engines: `frontend.engine_ca` when set, the system's
/// roots otherwise.
pub fn engine_client_config(source: &ConfigSource) -> Result<rustls::ClientConfig, String> {
    let roots = match &source.config.frontend.engine_ca {
        Some(ca) => roots("frontend.engine_ca", &source.resolve(ca))?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::debug!(
                    "no system CA certificates found; https engines need frontend.engine_ca"
                );
            }
            roots
        }
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("frontend: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Loads every TLS file the config names (both listeners' and `frontend.engine_ca`), as
/// `serve` would; the errors, for `check`.
pub fn check_files(source: &ConfigSource) -> Vec<String> {
    let config = &source.config;
    let ext_proc = config.ext_proc.as_ref().and_then(|e| e.tls.as_ref());
    let listeners = [
        ("http.tls", config.http.tls.as_ref(), HTTP_ALPN),
        ("ext_proc.tls", ext_proc, GRPC_ALPN),
    ];
    let mut errors: Vec<String> = listeners
        .into_iter()
        .filter_map(|(section, settings, alpn)| {
            server_config(section, settings?, source, alpn).err()
        })
        .collect();
    if config.frontend.engine_ca.is_some() {
        errors.extend(engine_client_config(source).err());
    }
    errors
        .into_iter()
        .map(|e| format!("{}: {e}", source.name))
        .collect()
}
