//! Mutual TLS for the agent's gRPC port (rustls through tonic), with a CA the operator provides.
//!
//! With `--tls-cert/--tls-key/--tls-ca`, the agent presents its certificate and requires every
//! client to present one signed by the CA: a coordinator without such a certificate cannot
//! complete the handshake, so it never reaches a handler (the token check comes on top, for
//! deployments that want both). The same files make the agent a client of its mirror backup
//! (`client_config`). Certificates made by `lockstep certs` carry extended key usages: an
//! agent's has serverAuth and clientAuth (it serves, and dials its backup), a coordinator's
//! clientAuth only. Which calls a certificate may make is decided by `PeerCert`: an agent's
//! certificate may open a mirror stream for its own writes and nothing else, so agents cannot
//! drive each other.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The three PEM files of one side of a mutual-TLS connection.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    /// This side's certificate (chain), PEM.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA that signs the other side's certificates, PEM.
    pub ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{flag} {path}: no PEM block \"{want}\" in it (expected a PEM file, e.g. from `lockstep certs`)"
    )]
    NotPem {
        flag: &'static str,
        path: String,
        want: &'static str,
    },
    #[error("--tls-cert, --tls-key and --tls-ca go together: {0} missing")]
    Incomplete(&'static str),
}

impl TlsFiles {
    /// All three or none: half a TLS configuration is refused rather than guessed at.
    pub fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, TlsError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            (c, k, _) => Err(TlsError::Incomplete(if c.is_none() {
                "--tls-cert"
            } else if k.is_none() {
                "--tls-key"
            } else {
                "--tls-ca"
            })),
        }
    }

    /// Reads and checks the three files: (certificate, key, CA) PEM bytes.
    pub fn read(&self) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>), TlsError> {
        let cert = read_pem(&self.cert, "--tls-cert", "CERTIFICATE")?;
        let key = read_pem(&self.key, "--tls-key", "PRIVATE KEY")?;
        let ca = read_pem(&self.ca, "--tls-ca", "CERTIFICATE")?;
        Ok((cert, key, ca))
    }

    /// Reads the three files once, for a process that serves and dials with them for its
    /// whole life (a file replaced later does not change what it presents).
    pub fn load(&self) -> Result<TlsIdentity, TlsError> {
        let (cert, key, ca) = self.read()?;
        Ok(TlsIdentity { cert, key, ca })
    }

    /// The agent's server side: its identity, and client certificates required from the CA.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        Ok(self.load()?.server_config())
    }
}

/// The three files' content, read once (`TlsFiles::load`).
#[derive(Clone)]
pub struct TlsIdentity {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

/// Without the key: a configuration printed in a log or an error must not carry it.
impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity { .. }")
    }
}

impl TlsIdentity {
    /// The server side: this identity, and a client certificate from the CA on every
    /// connection.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .client_auth_optional(false)
    }

    /// A client of the agent named `peer_name`: presents this identity, and accepts only a
    /// certificate from the CA issued for that *name*, whatever address the peer is reached at
    /// (an address says nothing about who answers).
    pub fn client_config(&self, peer_name: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(peer_name)
    }
}

/// Why a caller's certificate is refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PeerError {
    #[error("no client certificate (this agent requires mutual TLS)")]
    Missing,
    #[error("the client certificate cannot be read: {0}")]
    Unreadable(String),
    #[error(
        "the client certificate ({names}) is an agent's: it has the serverAuth usage (or no \
         extended key usage, which allows every use), and an agent may not drive another; a \
         coordinator's certificate has the clientAuth usage only (as `lockstep certs` issues it)"
    )]
    AgentAsCoordinator { names: String },
    #[error(
        "a mirror stream takes the primary agent's certificate (serverAuth and clientAuth), and \
         this one ({names}) has no serverAuth usage: a coordinator's certificate does not mirror"
    )]
    CoordinatorAsPrimary { names: String },
    #[error(
        "the mirror stream's primary is the agent '{primary}', but the client certificate is \
         issued for {names}: an agent mirrors only its own writes"
    )]
    NotThePrimary { primary: String, names: String },
}

/// What an agent reads from the certificate a caller presented (the handshake already checked
/// that the CA signed it and that it may be used by a client).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerCert {
    /// Its DNS names (subject alternative names): the agent or coordinator it was issued for.
    pub names: Vec<String>,
    /// It may serve, so it is an agent's: the serverAuth usage, anyExtendedKeyUsage, or no
    /// extended key usage at all (valid for every purpose, RFC 5280 4.2.1.12).
    pub serves: bool,
}

impl PeerCert {
    /// Reads a certificate (DER, the end entity of the chain the peer sent).
    pub fn parse(der: &[u8]) -> Result<PeerCert, PeerError> {
        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let bad = |e: &dyn std::fmt::Display| PeerError::Unreadable(e.to_string());
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| bad(&e))?;
        let serves = match cert.extended_key_usage().map_err(|e| bad(&e))? {
            None => true,
            Some(eku) => eku.value.server_auth || eku.value.any,
        };
        let names = match cert.subject_alternative_name().map_err(|e| bad(&e))? {
            None => Vec::new(),
            Some(san) => san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect(),
        };
        Ok(PeerCert { names, serves })
    }

    fn shown_names(&self) -> String {
        if self.names.is_empty() {
            return "no DNS name".into();
        }
        let quoted: Vec<String> = self.names.iter().map(|n| format!("'{n}'")).collect();
        quoted.join(", ")
    }

    /// Every call but `Mirror` is a coordinator's: refused to a certificate that may serve, so
    /// an agent's certificate cannot prepare, start or abort runs on another agent, and neither
    /// can a coordinator's certificate that also carries serverAuth.
    pub fn check_coordinator(&self) -> Result<(), PeerError> {
        if self.serves {
            return Err(PeerError::AgentAsCoordinator {
                names: self.shown_names(),
            });
        }
        Ok(())
    }

    /// A mirror stream comes from an agent: a certificate that may serve.
    pub fn check_agent(&self) -> Result<(), PeerError> {
        if !self.serves {
            return Err(PeerError::CoordinatorAsPrimary {
                names: self.shown_names(),
            });
        }
        Ok(())
    }

    /// A mirror stream: an agent's certificate (it may serve) issued for the primary agent's
    /// name, so a primary cannot write into another primary's mirror file.
    pub fn check_primary(&self, primary_agent: &str) -> Result<(), PeerError> {
        self.check_agent()?;
        if !self.names.iter().any(|n| n == primary_agent) {
            return Err(PeerError::NotThePrimary {
                primary: primary_agent.to_string(),
                names: self.shown_names(),
            });
        }
        Ok(())
    }
}

/// Whether an error's text (`error_chain`) looks like a failed TLS handshake. Under TLS 1.3 a
/// server refuses a client's certificate after the client thinks the handshake is done, so
/// the client sees only its next call fail: a connection closed, reset or cancelled right
/// after connecting counts too.
pub fn looks_like_handshake(text: &str) -> bool {
    let lower = text.to_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "alert",
        "frame",
        "connection reset",
        "connection closed",
        "broken pipe",
        "unexpected eof",
        "canceled",
        "h2 protocol",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// `first`, then every distinct message of the `source` chain: tonic's own transport error
/// says only "transport error", and the reason (a certificate for another name, an unknown
/// issuer) is further down.
pub fn error_chain(first: String, source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut chain = vec![first];
    let mut cur = source;
    while let Some(c) = cur {
        let m = c.to_string();
        if !chain.contains(&m) {
            chain.push(m);
        }
        cur = c.source();
    }
    chain.join(": ")
}

fn read_pem(path: &Path, flag: &'static str, want: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.display().to_string(),
        source,
    })?;
    // "PRIVATE KEY" also matches "RSA PRIVATE KEY" and "EC PRIVATE KEY".
    if !String::from_utf8_lossy(&bytes).contains(&format!("{want}-----")) {
        return Err(TlsError::NotPem {
            flag,
            path: path.display().to_string(),
            want,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_three_files_or_none() {
        assert_eq!(TlsFiles::from_flags(None, None, None).unwrap(), None);
        let p = |s: &str| Some(PathBuf::from(s));
        assert!(
            TlsFiles::from_flags(p("c"), p("k"), p("a"))
                .unwrap()
                .is_some()
        );
        let e = TlsFiles::from_flags(p("c"), None, p("a"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tls-key missing"), "{e}");
    }

    /// A certificate for `name` with these extended key usages (none: no extension at all).
    fn cert(name: &str, usages: &[rcgen::ExtendedKeyUsagePurpose]) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        p.extended_key_usages = usages.to_vec();
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn an_agents_certificate_mirrors_its_own_writes_and_drives_no_agent() {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let agent = PeerCert::parse(&cert("a1", &[ServerAuth, ClientAuth])).unwrap();
        assert_eq!(agent.names, vec!["a1".to_string()]);
        assert!(agent.serves);
        agent.check_primary("a1").unwrap();
        let e = agent.check_primary("a2").unwrap_err().to_string();
        assert!(e.contains("'a2'") && e.contains("'a1'"), "{e}");
        let e = agent.check_coordinator().unwrap_err().to_string();
        assert!(e.contains("is an agent's"), "{e}");

        let coordinator = PeerCert::parse(&cert("coordinator", &[ClientAuth])).unwrap();
        assert!(!coordinator.serves);
        coordinator.check_coordinator().unwrap();
        let e = coordinator
            .check_primary("coordinator")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no serverAuth"), "{e}");

        // A coordinator's certificate that may also serve, and one with no extended key usage
        // (valid for everything), are an agent's as far as the rules go.
        for usages in [&[ClientAuth, ServerAuth][..], &[]] {
            let c = PeerCert::parse(&cert("coordinator", usages)).unwrap();
            assert!(
                matches!(
                    c.check_coordinator(),
                    Err(PeerError::AgentAsCoordinator { .. })
                ),
                "{usages:?}"
            );
        }
        assert!(matches!(
            PeerCert::parse(b"not a certificate"),
            Err(PeerError::Unreadable(_))
        ));
    }

    #[test]
    fn a_file_that_is_not_pem_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.pem");
        std::fs::write(&f, "hello").unwrap();
        let e = read_pem(&f, "--tls-ca", "CERTIFICATE")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--tls-ca ") && e.contains("no PEM block"),
            "{e}"
        );
    }
}
