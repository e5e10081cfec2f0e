//! Mutual TLS between coordinator and agents with certificates from `lockstep certs`: a run
//! works; a coordinator without a valid client certificate is refused before any IO.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lockstep_tests::{RunStatus, bin, read_results, scratch, start_agent};

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
    // An agent's certificate (serverAuth only) used as a coordinator's.
    refused("agent-cert", tls_flags(&pki, "a2", &ca));
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
