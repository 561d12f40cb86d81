//! TLS with rustls (the ring provider): the listeners' server configs, read from the
//! config's PEM files and swapped on reload, and the client config for `https://`
//! engines. Every error names the setting and the file.

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use switchyard_config::{ConfigSource, TlsSettings};
use switchyard_plugin_host::file_gate::{self, FileKind, FileRefused};

/// What the HTTP listener offers over TLS: HTTP/2, then HTTP/1.1.
pub const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// What the gRPC listener offers: HTTP/2 only.
pub const GRPC_ALPN: &[&[u8]] = &[b"h2"];

/// A TLS file or setting that does not load (boxed: it is rare and carries paths).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct TlsError(Box<TlsProblem>);

impl TlsError {
    pub fn problem(&self) -> &TlsProblem {
        &self.0
    }
}

impl From<TlsProblem> for TlsError {
    fn from(problem: TlsProblem) -> Self {
        TlsError(Box::new(problem))
    }
}

/// What does not load; each names the setting and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsProblem {
    /// The file gate refused the file (not a regular file, too large, unreadable).
    #[error("{setting} {}: {error}", path.display())]
    Unreadable {
        setting: String,
        path: std::path::PathBuf,
        error: FileRefused,
    },
    #[error("{setting} {}: not a PEM certificate file: {error}", path.display())]
    NotPem {
        setting: String,
        path: std::path::PathBuf,
        error: rustls::pki_types::pem::Error,
    },
    #[error("{setting} {}: no certificate in it (expected PEM blocks `-----BEGIN CERTIFICATE-----`)", path.display())]
    NoCertificate {
        setting: String,
        path: std::path::PathBuf,
    },
    #[error("{setting} {}: not a usable CA certificate: {error}", path.display())]
    NotCa {
        setting: String,
        path: std::path::PathBuf,
        error: rustls::Error,
    },
    #[error("{section}.key {}: no private key read from it ({error}); expected a PEM `PRIVATE KEY` block", path.display())]
    NoKey {
        section: String,
        path: std::path::PathBuf,
        error: rustls::pki_types::pem::Error,
    },
    #[error("{section}: the key {} does not fit the certificate {}: {error}", key.display(), cert.display())]
    KeyMismatch {
        section: String,
        key: std::path::PathBuf,
        cert: std::path::PathBuf,
        error: rustls::Error,
    },
    #[error("{setting}: {error}")]
    ClientVerifier {
        setting: String,
        error: rustls::server::VerifierBuilderError,
    },
    #[error("{section}: {error}")]
    Protocols {
        section: String,
        error: rustls::Error,
    },
}

/// A TLS file of the config that does not load (`check`), or a listener whose
/// certificates a reload cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// `at`: the config file, and the line of the setting at fault when one is.
    #[error("{at}: {error}")]
    Unloadable { at: String, error: TlsError },
    #[error("{config}: `{section}` was removed, but the listener serves TLS; restart to serve it without")]
    Removed {
        config: String,
        section: &'static str,
    },
}

/// The TLS configs of the listeners that serve TLS, replaced by a reload.
#[derive(Clone, Default)]
pub struct ListenerTls {
    pub http: Option<Arc<ServerTls>>,
    pub ext_proc: Option<Arc<ServerTls>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default provider: the one reqwest and tonic use for
/// anything not configured here. Idempotent.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The bytes of a TLS file, through the file gate.
fn read(setting: &str, path: &Path, kind: FileKind) -> Result<Vec<u8>, TlsError> {
    file_gate::read(path, kind).map_err(|error| {
        TlsProblem::Unreadable {
            setting: setting.to_owned(),
            path: path.to_owned(),
            error,
        }
        .into()
    })
}

fn certificates(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(setting, path, FileKind::Certificate)?;
    let (setting, path) = (setting.to_owned(), path.to_owned());
    match CertificateDer::pem_slice_iter(&bytes).collect::<Result<Vec<_>, _>>() {
        Err(error) => Err(TlsProblem::NotPem {
            setting,
            path,
            error,
        }
        .into()),
        Ok(certs) if certs.is_empty() => Err(TlsProblem::NoCertificate { setting, path }.into()),
        Ok(certs) => Ok(certs),
    }
}

fn roots(setting: &str, path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(setting, path)? {
        roots.add(cert).map_err(|error| TlsProblem::NotCa {
            setting: setting.to_owned(),
            path: path.to_owned(),
            error,
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
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
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
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(&format!("{section}.cert"), cert_path)?;
    let key = read(&format!("{section}.key"), key_path, FileKind::PrivateKey)?;
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(|error| TlsProblem::NoKey {
        section: section.to_owned(),
        path: key_path.to_owned(),
        error,
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsProblem::Protocols {
            section: section.to_owned(),
            error,
        })?;
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
            .map_err(|error| TlsProblem::ClientVerifier { setting, error })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config =
        builder
            .with_single_cert(chain, key)
            .map_err(|error| TlsProblem::KeyMismatch {
                section: section.to_owned(),
                key: key_path.to_owned(),
                cert: cert_path.to_owned(),
                error,
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
pub fn engine_client_config(source: &ConfigSource) -> Result<rustls::ClientConfig, TlsError> {
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
        .map_err(|error| TlsProblem::Protocols {
            section: "frontend".to_owned(),
            error,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Loads every TLS file the config names (both listeners' and `frontend.engine_ca`), as
/// `serve` would; the errors, for `check`.
pub fn check_files(source: &ConfigSource) -> Vec<CertificateError> {
    let config = &source.config;
    let ext_proc = config.ext_proc.as_ref().and_then(|e| e.tls.as_ref());
    let listeners = [
        ("http.tls", config.http.tls.as_ref(), HTTP_ALPN),
        ("ext_proc.tls", ext_proc, GRPC_ALPN),
    ];
    let mut errors: Vec<TlsError> = listeners
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
        .map(|error| CertificateError::unloadable(source, error))
        .collect()
}

impl CertificateError {
    /// A TLS file of `source` that does not load, at the line of its setting.
    pub fn unloadable(source: &ConfigSource, error: TlsError) -> CertificateError {
        let line = error.problem().setting().and_then(|s| line_of(source, &s));
        CertificateError::Unloadable {
            at: match line {
                Some(line) => format!("{}:{line}", source.name),
                None => source.name.clone(),
            },
            error,
        }
    }
}

impl TlsProblem {
    /// The setting at fault (`http.tls.cert`, ...), when one file is.
    pub fn setting(&self) -> Option<String> {
        match self {
            TlsProblem::Unreadable { setting, .. }
            | TlsProblem::NotPem { setting, .. }
            | TlsProblem::NoCertificate { setting, .. }
            | TlsProblem::NotCa { setting, .. } => Some(setting.clone()),
            TlsProblem::NoKey { section, .. } => Some(format!("{section}.key")),
            _ => None,
        }
    }
}

/// The config line of a TLS file's `setting` (`http.tls.cert`): its `key: value` under
/// its top-level section.
fn line_of(source: &ConfigSource, setting: &str) -> Option<usize> {
    let config = &source.config;
    let ext_proc = config.ext_proc.as_ref().and_then(|e| e.tls.as_ref());
    let (section, tls) = match setting.split('.').next()? {
        "http" => ("http", config.http.tls.as_ref()),
        "ext_proc" => ("ext_proc", ext_proc),
        _ => ("frontend", None),
    };
    let key = setting.rsplit('.').next()?;
    let value = match (key, tls) {
        ("cert", Some(tls)) => &tls.cert,
        ("key", Some(tls)) => &tls.key,
        ("client_ca", Some(tls)) => tls.client_ca.as_ref()?,
        ("engine_ca", _) => config.frontend.engine_ca.as_ref()?,
        _ => return None,
    };
    let heading = format!("{section}:");
    let from = source.text.lines().position(|l| l.starts_with(&heading))? + 1;
    source.line_from(key, &value.to_string_lossy(), from)
}
