//! TLS settings shared by the network plugins, so every listener and every
//! client reads certificates the same way and says the same thing when a
//! file is wrong. rustls with the `ring` provider: no system OpenSSL, so
//! static builds keep working.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// `tls:` of a listening stage.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM certificate chain (server certificate first).
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// `tls:` of a connecting stage.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// PEM CA certificates to trust instead of the built-in Mozilla roots
    /// (for a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Name to verify the server's certificate against (default: the host
    /// of the address).
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} holds no certificate", .0.display())]
    NoCertificate(PathBuf),
    #[error("the private key in {} does not belong to the certificate in {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("`{0}` is not a valid server name")]
    ServerName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// Checks a certificate file as a stage would load it (`validate
/// --preflight`): readable, PEM, at least one certificate.
pub fn check_certificates(path: &Path) -> Result<(), TlsError> {
    certs(path).map(|_| ())
}

/// Checks a private key file as a stage would load it.
pub fn check_private_key(path: &Path) -> Result<(), TlsError> {
    PrivateKeyDer::from_pem_file(path)
        .map(|_| ())
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
}

/// Checks that the key is one rustls can sign with and belongs to the
/// certificate (the first of the chain), as a listener's start does.
pub fn check_identity(cert: &Path, key: &Path) -> Result<(), TlsError> {
    ServerTls {
        cert_file: cert.to_owned(),
        key_file: key.to_owned(),
    }
    .acceptor(Path::new(""))
    .map(|_| ())
}

impl ServerTls {
    /// Paths resolved against `base` (the pipeline file's directory).
    pub fn acceptor(&self, base: &Path) -> Result<TlsAcceptor, TlsError> {
        self.acceptor_with_alpn(base, &[])
    }

    /// The same, offering `protocols` by ALPN (most preferred first): a
    /// gRPC server offers `h2`, which gRPC clients require.
    pub fn acceptor_with_alpn(
        &self,
        base: &Path,
        protocols: &[&[u8]],
    ) -> Result<TlsAcceptor, TlsError> {
        let cert_file = base.join(&self.cert_file);
        let key_file = base.join(&self.key_file);
        let chain = certs(&cert_file)?;
        let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|source| TlsError::Read {
            path: key_file.clone(),
            source,
        })?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    TlsError::KeyMismatch {
                        cert: cert_file.clone(),
                        key: key_file.clone(),
                    }
                }
                other => other.into(),
            })?;
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ClientTls {
    /// The client configuration (paths resolved against `base`).
    pub fn config(&self, base: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        self.config_with_alpn(base, &[])
    }

    /// The same, asking for `protocols` by ALPN (`h2` for gRPC).
    pub fn config_with_alpn(
        &self,
        base: &Path,
        protocols: &[&[u8]],
    ) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_file {
            Some(ca) => {
                for cert in certs(&base.join(ca))? {
                    roots.add(cert)?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    pub fn connector(&self, base: &Path) -> Result<TlsConnector, TlsError> {
        Ok(TlsConnector::from(self.config(base)?))
    }

    /// The name to verify: `server_name`, or the host part of `address`.
    pub fn server_name(&self, address: &str) -> Result<ServerName<'static>, TlsError> {
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => address
                .rsplit_once(':')
                .map_or(address, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        ServerName::try_from(host.clone()).map_err(|_| TlsError::ServerName(host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_load_from_pem_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        self_signed(dir.path());
        let server = ServerTls {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
        };
        assert!(server.acceptor(dir.path()).is_ok());
        let client = ClientTls {
            ca_file: Some("c.pem".into()),
            server_name: None,
        };
        assert!(client.connector(dir.path()).is_ok());
        assert!(client.server_name("localhost:6514").is_ok());
        let bad = ServerTls {
            cert_file: "missing.pem".into(),
            key_file: "k.pem".into(),
        };
        let err = bad.acceptor(dir.path()).err().unwrap().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        let err = ClientTls {
            ca_file: Some("empty.pem".into()),
            server_name: None,
        }
        .config(dir.path())
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("no certificate"), "{err}");
    }

    /// A self-signed `localhost` certificate and key in `dir` as `c.pem`
    /// and `k.pem`.
    #[test]
    fn a_key_that_belongs_to_another_certificate_is_found() {
        let one = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        self_signed(one.path());
        self_signed(other.path());
        let (c1, k1) = (one.path().join("c.pem"), one.path().join("k.pem"));
        let k2 = other.path().join("k.pem");
        assert!(check_certificates(&c1).is_ok());
        assert!(check_private_key(&k1).is_ok());
        assert!(check_identity(&c1, &k1).is_ok());
        let err = check_identity(&c1, &k2).err().unwrap().to_string();
        assert!(err.contains("does not belong to the certificate"), "{err}");
        assert!(check_private_key(&c1).is_err(), "a certificate is no key");
        assert!(check_certificates(&k1).is_err(), "a key is no certificate");
        let broken = one.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nMII!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(check_certificates(&broken).is_err());
    }

    fn self_signed(dir: &Path) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.join("c.pem"), cert.cert.pem()).unwrap();
        std::fs::write(dir.join("k.pem"), cert.key_pair.serialize_pem()).unwrap();
    }

    /// The acceptor and connector made from the files talk to each other:
    /// the client trusts the private CA, checks the name, and the two agree
    /// on the protocol offered by ALPN.
    #[tokio::test]
    async fn a_client_and_a_server_made_from_the_files_complete_a_handshake() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        self_signed(dir.path());
        let server = ServerTls {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
        };
        let client = ClientTls {
            ca_file: Some("c.pem".into()),
            server_name: None,
        };
        let acceptor = server.acceptor_with_alpn(dir.path(), &[b"h2"]).unwrap();
        let connector = TlsConnector::from(client.config_with_alpn(dir.path(), &[b"h2"]).unwrap());
        let name = client.server_name("localhost:4317").unwrap();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let serve = async move {
            let mut tls = acceptor.accept(a).await.expect("server side");
            let mut got = [0u8; 5];
            tls.read_exact(&mut got).await.unwrap();
            tls.write_all(&got).await.unwrap();
            tls.flush().await.unwrap();
            tls
        };
        let connect = async move {
            let mut tls = connector.connect(name, b).await.expect("client side");
            tls.write_all(b"hello").await.unwrap();
            let mut echo = [0u8; 5];
            tls.read_exact(&mut echo).await.unwrap();
            (tls, echo)
        };
        let (served, (connected, echo)) = tokio::join!(serve, connect);
        assert_eq!(&echo, b"hello");
        assert_eq!(served.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(connected.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

        // Without ALPN on either side none is agreed; a name the
        // certificate does not carry is refused.
        let plain = server.acceptor(dir.path()).unwrap();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let wrong = ClientTls {
            server_name: Some("example.org".into()),
            ..client.clone()
        };
        let name = wrong.server_name("localhost:4317").unwrap();
        let connector = wrong.connector(dir.path()).unwrap();
        let (_, refused) = tokio::join!(plain.accept(a), connector.connect(name, b));
        let Err(err) = refused else {
            panic!("the name does not match")
        };
        let err = err.to_string();
        assert!(err.contains("certificate"), "{err}");
    }

    /// Without `ca_file` the built-in roots are trusted, and a private
    /// certificate is not.
    #[tokio::test]
    async fn without_a_ca_file_a_self_signed_server_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        self_signed(dir.path());
        let acceptor = ServerTls {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
        }
        .acceptor(dir.path())
        .unwrap();
        let client = ClientTls::default();
        assert!(client.config(dir.path()).unwrap().alpn_protocols.is_empty());
        let connector = client.connector(dir.path()).unwrap();
        let (a, b) = tokio::io::duplex(64 * 1024);
        let name = client.server_name("localhost:443").unwrap();
        let (_, refused) = tokio::join!(acceptor.accept(a), connector.connect(name, b));
        let Err(err) = refused else {
            panic!("not signed by a known root")
        };
        let err = err.to_string();
        assert!(err.contains("UnknownIssuer"), "{err}");
    }

    #[test]
    fn the_server_name_is_the_host_of_the_address_unless_given() {
        let client = ClientTls::default();
        let name = |address: &str| client.server_name(address).map(|n| n.to_str().into_owned());
        assert_eq!(name("logs.internal:6514").unwrap(), "logs.internal");
        assert_eq!(name("logs.internal").unwrap(), "logs.internal");
        assert_eq!(name("10.0.0.7:6514").unwrap(), "10.0.0.7");
        assert_eq!(name("[::1]:6514").unwrap(), "::1");
        let given = ClientTls {
            server_name: Some("collector.example".into()),
            ..ClientTls::default()
        };
        assert_eq!(
            given.server_name("10.0.0.7:4317").unwrap().to_str(),
            "collector.example"
        );
        let err = client.server_name("bad name:1").unwrap_err().to_string();
        assert_eq!(err, "`bad name` is not a valid server name");
    }

    #[test]
    fn a_key_that_is_not_there_or_does_not_fit_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        self_signed(dir.path());
        let missing_key = ServerTls {
            cert_file: "c.pem".into(),
            key_file: "nokey.pem".into(),
        };
        let err = missing_key.acceptor(dir.path()).err().unwrap().to_string();
        assert!(
            err.starts_with("reading ") && err.contains("nokey.pem"),
            "{err}"
        );
        let other = rcgen::generate_simple_self_signed(vec!["other".into()]).unwrap();
        std::fs::write(dir.path().join("k2.pem"), other.key_pair.serialize_pem()).unwrap();
        let mismatched = ServerTls {
            cert_file: "c.pem".into(),
            key_file: "k2.pem".into(),
        };
        let err = mismatched.acceptor(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("k2.pem does not belong to the certificate"),
            "{err}"
        );
        std::fs::write(
            dir.path().join("junk.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = ClientTls {
            ca_file: Some("junk.pem".into()),
            server_name: None,
        }
        .config(dir.path())
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("junk.pem"), "{err}");
    }
}
