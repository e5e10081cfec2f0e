//! `lockstep certs`: a test CA and certificates for mutual TLS between coordinators and agents.
//!
//! For a quick start and for tests; in production the operator's own CA issues them. Each agent
//! gets a certificate for its *name* (DNS SAN) with the serverAuth and clientAuth usages (it
//! serves the coordinator, and dials its mirror backup as a client), and the coordinator one
//! with clientAuth only: the coordinator and a mirror's primary check that the agent they
//! dialed holds the certificate of the agent they meant (by name, whatever address it was
//! reached at), and agents refuse every call but `Mirror` from a certificate that may serve, so
//! an agent's certificate cannot be used to drive other agents (`lockstep_core::tls`).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("certificate for '{name}': {source}")]
    Generate { name: String, source: rcgen::Error },
    #[error("{path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} already exists: choose another --out (certificates are never overwritten)")]
    Exists(String),
    #[error("'{0}' is not a usable name (letters, digits, '-' and '.')")]
    BadName(String),
}

/// What was written, for the command's output.
#[derive(Debug)]
pub struct Written {
    pub files: Vec<PathBuf>,
}

fn write(
    path: &Path,
    text: &str,
    secret: bool,
    files: &mut Vec<PathBuf>,
) -> Result<(), CertsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CertsError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CertsError::Exists(path.display().to_string())
            } else {
                err(e)
            }
        })?;
    f.write_all(text.as_bytes()).map_err(err)?;
    files.push(path.to_path_buf());
    Ok(())
}

fn leaf(
    name: &str,
    usages: &[ExtendedKeyUsagePurpose],
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String), CertsError> {
    let gen_err = |source| CertsError::Generate {
        name: name.to_string(),
        source,
    };
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !valid {
        return Err(CertsError::BadName(name.to_string()));
    }
    let mut params = CertificateParams::new(vec![name.to_string()]).map_err(gen_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "lockstep");
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages.to_vec();
    let key = KeyPair::generate().map_err(gen_err)?;
    let cert = params.signed_by(&key, issuer).map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `ca.pem`/`ca.key`, `<agent>.pem`/`<agent>.key` for every agent and
/// `<coordinator>.pem`/`.key` for every coordinator name into `out` (created if needed).
/// Keys are mode 0600. Nothing is overwritten.
pub fn generate(
    out: &Path,
    agents: &[String],
    coordinators: &[String],
) -> Result<Written, CertsError> {
    std::fs::create_dir_all(out).map_err(|source| CertsError::Write {
        path: out.display().to_string(),
        source,
    })?;
    let mut files = Vec::new();
    let ca_err = |source| CertsError::Generate {
        name: "ca".into(),
        source,
    };
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "lockstep test CA");
    dn.push(DnType::OrganizationName, "lockstep");
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().map_err(ca_err)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(ca_err)?;
    write(&out.join("ca.pem"), &ca_cert.pem(), false, &mut files)?;
    write(
        &out.join("ca.key"),
        &ca_key.serialize_pem(),
        true,
        &mut files,
    )?;
    let issuer = Issuer::new(ca, ca_key);
    use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    for (names, usages) in [
        (agents, &[ServerAuth, ClientAuth][..]),
        (coordinators, &[ClientAuth][..]),
    ] {
        for name in names {
            let (cert, key) = leaf(name, usages, &issuer)?;
            write(&out.join(format!("{name}.pem")), &cert, false, &mut files)?;
            write(&out.join(format!("{name}.key")), &key, true, &mut files)?;
        }
    }
    Ok(Written { files })
}

/// `lockstep certs --out DIR --agents a,b,c [--coordinators coordinator]`.
pub fn certs_command(
    out: &Path,
    agents: &[String],
    coordinators: &[String],
) -> anyhow::Result<std::process::ExitCode> {
    anyhow::ensure!(
        !agents.is_empty(),
        "--agents: name at least one agent (their --name)"
    );
    let w = generate(out, agents, coordinators)?;
    for f in &w.files {
        println!("{}", f.display());
    }
    let a = &agents[0];
    let c = coordinators
        .first()
        .map(String::as_str)
        .unwrap_or("coordinator");
    let d = out.display();
    eprintln!(
        "lockstep: a test CA; the agent '{a}' serves with\n  lockstep-agent serve --name {a} --tls-cert {d}/{a}.pem --tls-key {d}/{a}.key --tls-ca {d}/ca.pem ...\n\
         and the coordinator dials with\n  lockstep run PLAN --tls-cert {d}/{c}.pem --tls-key {d}/{c}.key --tls-ca {d}/ca.pem ...\n\
         Keep ca.key offline (or delete it): whoever holds it can drive every agent."
    );
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_ca_and_one_pair_per_name_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let w = generate(
            dir.path(),
            &["a1".into(), "a2".into()],
            &["coordinator".into()],
        )
        .unwrap();
        assert_eq!(w.files.len(), 8);
        let key = std::fs::metadata(dir.path().join("a1.key")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
        assert!(
            std::fs::read_to_string(dir.path().join("a2.pem"))
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        // An agent's certificate serves and dials (its mirror backup); a coordinator's only
        // dials, so agents take its calls and refuse an agent's.
        let der = |name: &str| {
            let pem = std::fs::read_to_string(dir.path().join(format!("{name}.pem"))).unwrap();
            let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            use base64::Engine;
            let der = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            lockstep_core::tls::PeerCert::parse(&der).unwrap()
        };
        let a1 = der("a1");
        assert!(a1.serves && a1.names == ["a1"]);
        a1.check_primary("a1").unwrap();
        let c = der("coordinator");
        assert!(!c.serves && c.names == ["coordinator"]);
        c.check_coordinator().unwrap();
        let again = generate(dir.path(), &["a1".into()], &[])
            .unwrap_err()
            .to_string();
        assert!(again.contains("already exists"), "{again}");
        let bad = generate(&dir.path().join("x"), &["a b".into()], &[])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("not a usable name"), "{bad}");
    }
}
