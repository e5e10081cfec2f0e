//! deploy/: the systemd units pass `systemd-analyze verify`, the agent speaks systemd's notify
//! protocol (readiness, watchdog, stopping), and the FROM-scratch image runs our binary.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_tests::{Proc, bin, scratch};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Receives notify datagrams until one contains `want`, or `limit` passes.
fn recv_until(sock: &UnixDatagram, want: &str, limit: Duration) -> Option<String> {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    while t.elapsed() < limit {
        sock.set_read_timeout(Some(
            limit
                .saturating_sub(t.elapsed())
                .max(Duration::from_millis(10)),
        ))
        .unwrap();
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.lines().any(|l| l == want) {
                return Some(msg);
            }
        }
    }
    None
}

#[test]
fn the_agent_tells_systemd_it_is_ready_pings_the_watchdog_and_says_when_it_stops() {
    let dir = scratch();
    let vol = dir.path().join("v");
    std::fs::create_dir_all(&vol).unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let started = Instant::now();
    let agent = Proc(
        Command::new(bin("lockstep-agent"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--name",
                "n1",
                "--volume",
            ])
            .arg(format!("data={}", vol.display()))
            .env("NOTIFY_SOCKET", &sock_path)
            // A 400 ms watchdog: pings every 200 ms.
            .env("WATCHDOG_USEC", "400000")
            .env_remove("WATCHDOG_PID")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready =
        recv_until(&sock, "READY=1", Duration::from_secs(10)).expect("no READY=1 from the agent");
    assert!(ready.contains("STATUS=serving on 127.0.0.1:"), "{ready}");
    eprintln!(
        "READY=1 {:.0} ms after spawn",
        started.elapsed().as_secs_f64() * 1e3
    );
    for _ in 0..3 {
        recv_until(&sock, "WATCHDOG=1", Duration::from_secs(2)).expect("no WATCHDOG=1 ping");
    }
    agent.signal(libc::SIGTERM);
    recv_until(&sock, "STOPPING=1", Duration::from_secs(5)).expect("no STOPPING=1 on SIGTERM");
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let out = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze is not installed ({e}): apt-get install systemd \
                 (scripts/setup.sh does)"
            )
        });
    assert!(
        out.status.success(),
        "systemd-analyze --version failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = scratch();
    let bin_dir = bin("lockstep-agent").parent().unwrap().to_path_buf();
    let units = [
        ("lockstep-agent.service", "lockstep-agent.service"),
        ("lockstep-run@.service", "lockstep-run@nightly.service"),
        (
            "lockstep-coordinator.service",
            "lockstep-coordinator.service",
        ),
    ];
    let mut paths = Vec::new();
    for (src, dst) in units {
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(src)).unwrap();
        // verify checks that ExecStart's binary exists: point it at the built one.
        let text = text.replace("/usr/local/bin/", &format!("{}/", bin_dir.display()));
        let p = dir.path().join(dst);
        std::fs::write(&p, text).unwrap();
        paths.push(p);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Warnings (an unknown key, a bad value) go to stderr with exit 0: refuse them too.
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("lockstep")).collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify:\n{err}"
    );
}

#[test]
fn the_from_scratch_image_runs_the_agent() {
    use lockstep_tests::docker::{block_on, build_image, client};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};
    lockstep_tests::docker::require_docker();
    let bin_dir = bin("lockstep-agent").parent().unwrap().to_path_buf();
    build_image(Some(&bin_dir), "lockstep:deploy-test");
    // `--version` from each entry point of the image: the agent's (the default) and the
    // coordinator's.
    let version = |entrypoint: Option<&str>| {
        let mut image = GenericImage::new("lockstep", "deploy-test");
        if let Some(e) = entrypoint {
            image = image.with_entrypoint(e);
        }
        block_on(async {
            let c = image.with_cmd(["--version"]).start().await.unwrap();
            let t = Instant::now();
            while c.is_running().await.unwrap() && t.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let code = c.exit_code().await.unwrap();
            let out = String::from_utf8_lossy(&c.stdout_to_vec().await.unwrap()).into_owned();
            let err = String::from_utf8_lossy(&c.stderr_to_vec().await.unwrap()).into_owned();
            (code, out, err)
        })
    };
    let (code, out, err) = version(None);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        format!("lockstep-agent {}", env!("CARGO_PKG_VERSION"))
    );
    let (code, out, err) = version(Some("/usr/local/bin/lockstep"));
    assert!(
        code == Some(0) && out.starts_with("lockstep "),
        "{out}{err}"
    );
    let _ = block_on(client().remove_image(
        "lockstep:deploy-test",
        None::<bollard::query_parameters::RemoveImageOptions>,
        None,
    ));
}
