//! Mutual TLS between coordinator and agents with certificates from `lockstep certs`: a run
//! works; a coordinator without a valid client certificate is refused before any IO. Between
//! the agents of a mirrored pair: the primary dials its backup over mutual TLS and checks the
//! backup's name, the backup takes a mirror stream only from the primary's own certificate,
//! and an agent's certificate drives no other agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lockstep::results::mirror::{MirrorPair, MirrorRole};
use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::v1::agent_client::AgentClient;
use lockstep_proto::v1::{MirrorAck, MirrorWrite, PrepareRequest};
use lockstep_tests::{RunStatus, bin, read_results, scratch, serial, start_agent};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

fn certs(out: &Path, agents: &str) {
    let o = Command::new(bin("lockstep"))
        .args(["certs", "--agents", agents, "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lockstep certs: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn tls_flags(dir: &Path, name: &str, ca: &Path) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        dir.join(format!("{name}.pem")).display().to_string(),
        "--tls-key".into(),
        dir.join(format!("{name}.key")).display().to_string(),
        "--tls-ca".into(),
        ca.display().to_string(),
    ]
}

fn plan(dir: &Path, agents: &[(&str, &str)]) -> PathBuf {
    let mut s = "name = \"tls\"\nduration = \"2s\"\ninterval = \"1s\"\n".to_string();
    for (n, a) in agents {
        s += &format!("\n[[agent]]\nname = \"{n}\"\naddress = \"{a}\"\n");
    }
    s += "\n[[role]]\nname = \"w\"\n[role.workload.fio]\nrw = \"randread\"\nbs = \"4k\"\niodepth = 2\nsize = \"4m\"\n";
    let p = dir.join("plan.toml");
    std::fs::write(&p, s).unwrap();
    p
}

fn run(plan: &Path, out: &Path, flags: &[String]) -> Output {
    Command::new(bin("lockstep"))
        .arg("run")
        .arg(plan)
        .arg("--output")
        .arg(out)
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_run_over_mutual_tls_works_and_coordinators_without_a_valid_certificate_are_refused() {
    let dir = scratch();
    let pki = dir.path().join("pki");
    certs(&pki, "a1,a2");
    let ca = pki.join("ca.pem");
    let mut agents = Vec::new();
    let mut addrs = Vec::new();
    for name in ["a1", "a2"] {
        let vol = dir.path().join(format!("v-{name}"));
        std::fs::create_dir_all(&vol).unwrap();
        let flags = tls_flags(&pki, name, &ca);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (p, a) = start_agent(name, &vol, &flags);
        agents.push(p);
        addrs.push(a);
    }
    let plan = plan(dir.path(), &[("a1", &addrs[0]), ("a2", &addrs[1])]);

    // The coordinator's certificate from the same CA: the run completes on both agents.
    let o = run(
        &plan,
        &dir.path().join("ok"),
        &tls_flags(&pki, "coordinator", &ca),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = read_results(&dir.path().join("ok"));
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(r.volumes.len(), 2);

    let refused = |label: &str, flags: Vec<String>| {
        let out = dir.path().join(label);
        let o = run(&plan, &out, &flags);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(2), "{label}: {err}");
        assert!(!out.join("results.json").exists(), "{label}");
        eprintln!("{label}: {}", err.lines().last().unwrap_or_default());
        err
    };
    // No client certificate at all (plain HTTP/2 against a TLS port).
    let err = refused("plain", vec![]);
    assert!(err.contains("a1"), "{err}");
    // A certificate from another CA.
    let other = dir.path().join("other-pki");
    certs(&other, "a1");
    refused("other-ca", tls_flags(&other, "coordinator", &ca));
    // An agent's certificate used as a coordinator's: the handshake passes (an agent's has
    // clientAuth, for its mirror link), the agent refuses the call.
    let err = refused("agent-cert", tls_flags(&pki, "a2", &ca));
    assert!(err.contains("is an agent's"), "{err}");
    // The right CA, but the agent at a1's address does not hold a1's certificate.
    let vol = dir.path().join("v-imp");
    std::fs::create_dir_all(&vol).unwrap();
    let flags = tls_flags(&pki, "a2", &ca);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (_imp, imp_addr) = start_agent("a1", &vol, &flags);
    let plan2 = dir.path().join("sub");
    std::fs::create_dir_all(&plan2).unwrap();
    let plan2 = self::plan(&plan2, &[("a1", &imp_addr)]);
    let out = dir.path().join("impostor");
    let o = run(&plan2, &out, &tls_flags(&pki, "coordinator", &ca));
    assert_eq!(
        o.status.code(),
        Some(2),
        "an agent holding another agent's certificate was accepted"
    );
    // Nothing was written on any volume by the refused runs.
    assert!(std::fs::read_dir(&vol).unwrap().next().is_none());
}

#[test]
fn half_a_tls_configuration_is_refused() {
    let dir = scratch();
    let o = Command::new(bin("lockstep-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--volume"])
        .arg(format!("data={}", dir.path().display()))
        .args(["--tls-cert", "x.pem"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--tls-key missing"), "{err}");
}

#[test]
fn agents_found_in_etcd_are_dialed_over_mutual_tls_and_a_coordinator_without_it_is_told_why() {
    let etcd = lockstep_tests::Etcd::start();
    let dir = scratch();
    let pki = dir.path().join("pki");
    certs(&pki, "e1,e2");
    let ca = pki.join("ca.pem");
    let mut agents = Vec::new();
    for name in ["e1", "e2"] {
        let vol = dir.path().join(format!("v-{name}"));
        std::fs::create_dir_all(&vol).unwrap();
        let mut flags = tls_flags(&pki, name, &ca);
        flags.extend(["--etcd".to_string(), etcd.url.clone()]);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        agents.push(start_agent(name, &vol, &flags).0);
    }
    let listed = lockstep_tests::wait_for(std::time::Duration::from_secs(5), || {
        let o = Command::new(bin("lockstep"))
            .args(["agents", "--etcd", &etcd.url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).matches(", mTLS").count() == 2
    });
    assert!(listed, "the registry does not show both agents as mTLS");
    let plan = plan(dir.path(), &[]);
    let etcd_flags = vec!["--etcd".to_string(), etcd.url.clone()];
    let o = run(&plan, &dir.path().join("plain"), &etcd_flags);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("e1, e2 require mutual TLS"), "{err}");
    let mut flags = tls_flags(&pki, "coordinator", &ca);
    flags.extend(etcd_flags);
    let o = run(&plan, &dir.path().join("ok"), &flags);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        read_results(&dir.path().join("ok")).status,
        RunStatus::Completed
    );
}

/// A test CA with certificates for `names` (and "coordinator") in `dir/sub`: the folder and
/// its `ca.pem`.
fn make_pki(dir: &Path, sub: &str, names: &str) -> (PathBuf, PathBuf) {
    let out = dir.join(sub);
    certs(&out, names);
    let ca = out.join("ca.pem");
    (out, ca)
}

/// One CA file trusting both `a` and `b` (PEM certificates concatenate).
fn ca_bundle(dir: &Path, a: &Path, b: &Path) -> PathBuf {
    let p = dir.join("both-cas.pem");
    let text = std::fs::read_to_string(a).unwrap() + &std::fs::read_to_string(b).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

/// Starts an agent over mutual TLS with `cert`'s files from `pki`, trusting `ca`.
fn tls_agent(
    dir: &Path,
    name: &str,
    pki: &Path,
    cert: &str,
    ca: &Path,
    extra: &[&str],
) -> (lockstep_tests::Proc, String) {
    let vol = dir.join(format!("v-{name}"));
    std::fs::create_dir_all(&vol).unwrap();
    let mut flags = tls_flags(pki, cert, ca);
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    start_agent(name, &vol, &flags)
}

/// A synchronously mirrored pair: a1's writes go to b1, failing over after 1 s without an ack.
fn mirror_plan(dir: &Path, a1: &str, b1: &str) -> PathBuf {
    let s = format!(
        r#"name = "tls-mirror"
duration = "4s"
interval = "1s"

[[agent]]
name = "a1"
address = "{a1}"

[[agent]]
name = "b1"
address = "{b1}"

[[role]]
name = "primary"
select = {{ agents = ["a1"] }}
rate_iops = 200
mirror = {{ to = "backup", mode = "sync", failover_after = "1s" }}
[role.workload.fio]
rw = "randwrite"
bs = "4k"
iodepth = 8
size = "4m"

[[role]]
name = "backup"
select = {{ agents = ["b1"] }}
rate_iops = 10
workload = {{ fio = {{ rw = "randread", bs = "4k", iodepth = 1, size = "4m" }} }}
"#
    );
    let p = dir.join("mirror-plan.toml");
    std::fs::write(&p, s).unwrap();
    p
}

fn primary(r: &lockstep::results::RunResults) -> (&MirrorRole, &MirrorPair) {
    let m = r.mirror.as_ref().expect("a mirror report in results.json");
    let role = m.roles.iter().find(|x| x.role == "primary").expect("role");
    (role, &role.pairs[0])
}

#[test]
fn a_mirrored_pair_over_mutual_tls_mirrors_every_write() {
    let _guard = serial();
    let dir = scratch();
    let (pki, ca) = make_pki(dir.path(), "pki", "a1,b1");
    let token = ["--token", "s3cret"];
    let (_a1, a1) = tls_agent(dir.path(), "a1", &pki, "a1", &ca, &token);
    let (_b1, b1) = tls_agent(dir.path(), "b1", &pki, "b1", &ca, &token);
    let plan = mirror_plan(dir.path(), &a1, &b1);
    let out = dir.path().join("run");
    let mut flags = tls_flags(&pki, "coordinator", &ca);
    flags.extend(token.iter().map(|s| s.to_string()));
    let o = run(&plan, &out, &flags);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Completed);
    let (role, pair) = primary(&r);
    println!(
        "over mTLS: {} mirrored, {} unmirrored, link error {:?}",
        role.mirrored, role.unmirrored, pair.link_error
    );
    assert_eq!(pair.backup, "b1");
    // 200 writes/s for 4 s, all mirrored but the few still in flight when the time was up.
    assert!(
        role.mirrored > 400,
        "{} mirrored: {}",
        role.mirrored,
        pair.link_error
    );
    assert!(role.unmirrored <= 8, "{} unmirrored", role.unmirrored);
    assert!(pair.failover_at_ms.is_empty(), "{pair:?}");
    assert!(pair.link_error.is_empty(), "{}", pair.link_error);
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(report.contains("a1/data -> b1:"), "{report}");
}

#[test]
fn a_backup_with_a_certificate_of_another_ca_is_named_and_the_primary_fails_over() {
    let _guard = serial();
    let dir = scratch();
    let (pki, ca) = make_pki(dir.path(), "pki", "a1,b1");
    // b1 holds a certificate for its name from another CA. It trusts the cluster's CA, and the
    // coordinator trusts both, so the run reaches b1: only the primary refuses it.
    let (other, other_ca) = make_pki(dir.path(), "other-pki", "b1");
    let (_a1, a1) = tls_agent(dir.path(), "a1", &pki, "a1", &ca, &[]);
    let (_b1, b1) = tls_agent(dir.path(), "b1", &other, "b1", &ca, &[]);
    let both = ca_bundle(dir.path(), &ca, &other_ca);
    let plan = mirror_plan(dir.path(), &a1, &b1);
    let out = dir.path().join("run");
    let o = run(&plan, &out, &tls_flags(&pki, "coordinator", &both));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(out.join("results.json").is_file(), "no results: {err}");
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Completed, "{err}");
    let (role, pair) = primary(&r);
    println!("link error: {}", pair.link_error);
    assert!(
        pair.link_error.contains("b1") && pair.link_error.contains("for the name 'b1'"),
        "{}",
        pair.link_error
    );
    // Nothing reached the backup; the primary failed over 1 s after its first write and
    // completed the rest locally.
    assert_eq!(role.mirrored, 0);
    assert!(role.unmirrored > 400, "{} unmirrored", role.unmirrored);
    assert_eq!(pair.failover_at_ms.len(), 1, "{pair:?}");
    assert!(pair.did_not_return, "{pair:?}");
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(report.contains("for the name 'b1'"), "{report}");
}

/// A gRPC client of the agent `server` at `addr` (its certificate from `ca`), presenting
/// `cert`'s certificate from `pki`.
async fn tls_client(
    addr: &str,
    server: &str,
    ca: &Path,
    pki: &Path,
    cert: &str,
) -> AgentClient<Channel> {
    let read = |f: String| std::fs::read(pki.join(f)).unwrap();
    let cfg = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .identity(Identity::from_pem(
            read(format!("{cert}.pem")),
            read(format!("{cert}.key")),
        ))
        .domain_name(server);
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(cfg)
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{cert} -> {server}: {e:?}"));
    AgentClient::new(channel)
}

/// Opens a mirror stream naming `primary`, with or without the token, and returns the answer
/// to its first message (a probe).
async fn mirror_probe(
    client: &mut AgentClient<Channel>,
    primary: &str,
    token: bool,
) -> Result<MirrorAck, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(MirrorWrite {
        protocol_version: PROTOCOL_VERSION,
        run_id: "r1".into(),
        volume: "data".into(),
        primary: primary.into(),
        ..MirrorWrite::default()
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if token {
        req.metadata_mut()
            .insert("authorization", "Bearer s3cret".parse().unwrap());
    }
    let mut acks = client.mirror(req).await?.into_inner();
    let ack = acks.message().await?;
    ack.ok_or_else(|| tonic::Status::aborted("the stream ended without an answer"))
}

#[test]
fn only_the_primarys_own_certificate_opens_a_mirror_stream_and_agents_drive_no_agent() {
    let dir = scratch();
    let (pki, ca) = make_pki(dir.path(), "pki", "a1,a2,b1");
    // A coordinator's certificate that also carries serverAuth: `lockstep certs` issues one as
    // an agent's, from another CA that b1 trusts too.
    let (dual, dual_ca) = make_pki(dir.path(), "dual-pki", "coordinator2");
    let both = ca_bundle(dir.path(), &ca, &dual_ca);
    let (_b1, b1) = tls_agent(dir.path(), "b1", &pki, "b1", &both, &["--token", "s3cret"]);
    let volume = dir.path().join("v-b1");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The coordinator's certificate, even with the token: refused at the call.
        let mut c = tls_client(&b1, "b1", &ca, &pki, "coordinator").await;
        let e = mirror_probe(&mut c, "coordinator/data", true)
            .await
            .unwrap_err();
        println!("coordinator's certificate: {}", e.message());
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("no serverAuth"), "{e:?}");
        // Another agent's certificate, for a1's writes: refused at the first write.
        let mut a2 = tls_client(&b1, "b1", &ca, &pki, "a2").await;
        let e = mirror_probe(&mut a2, "a1/data", true).await.unwrap_err();
        println!("a2's certificate for a1: {}", e.message());
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("'a1'"), "{e:?}");
        assert!(
            std::fs::read_dir(&volume).unwrap().next().is_none(),
            "a refused stream wrote into the backup's volume"
        );
        // a1's own certificate: without the token refused as before, with it accepted.
        let mut a1 = tls_client(&b1, "b1", &ca, &pki, "a1").await;
        let e = mirror_probe(&mut a1, "a1/data", false).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let ack = mirror_probe(&mut a1, "a1/data", true).await.unwrap();
        assert_eq!((ack.seq, ack.error.as_str()), (0, ""));

        // Coordinator calls: an agent's certificate cannot prepare a run on b1, nor can a
        // coordinator's certificate that may serve too; the coordinator's own can.
        let prepare = |run_id: &str| PrepareRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: run_id.into(),
            work: Vec::new(),
            interval_ms: 1000,
            keep_files: false,
        };
        let with_token = |m: PrepareRequest| {
            let mut req = tonic::Request::new(m);
            req.metadata_mut()
                .insert("authorization", "Bearer s3cret".parse().unwrap());
            req
        };
        let e = a2.prepare(with_token(prepare("by-a2"))).await.unwrap_err();
        println!("Prepare with a2's certificate: {}", e.message());
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("is an agent's"), "{e:?}");
        let mut d = tls_client(&b1, "b1", &ca, &dual, "coordinator2").await;
        let e = d.prepare(with_token(prepare("by-dual"))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        c.prepare(with_token(prepare("by-coordinator")))
            .await
            .expect("the coordinator's certificate prepares");
    });
}
