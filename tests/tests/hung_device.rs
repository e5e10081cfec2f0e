//! A device that stops answering mid-run: the run still ends, soon after its end, with the IOs
//! that never came back named, a non-zero exit and the results written.
//!
//! The device is real: a FUSE filesystem (bindfs over a scratch directory) whose server is
//! stopped with SIGSTOP, so reads and writes through it wait in the kernel for an answer that
//! does not come until SIGCONT, as on a hung NFS server or a volume that froze. Where the
//! machine has no /dev/fuse or no bindfs the tests fail, naming what to install or enable (the
//! suite's rule: fail, not skip; `scripts/setup.sh` installs bindfs and fuse3).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_tests::{bin, scratch};

/// bindfs in the foreground, unmounted (and let go on) however the test ends.
struct Fuse {
    server: Child,
    mnt: PathBuf,
}

impl Fuse {
    fn mount(src: &Path, mnt: &Path) -> Result<Fuse, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err(
                "no /dev/fuse on this machine: load the fuse module (modprobe fuse) or, \
                        in a container, pass --device /dev/fuse --cap-add SYS_ADMIN"
                    .into(),
            );
        }
        let server = Command::new("bindfs")
            .arg("-f")
            .arg(src)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "bindfs is not installed ({e}): apt-get install bindfs fuse3 \
                     (scripts/setup.sh does)"
                )
            })?;
        let fuse = Fuse {
            server,
            mnt: mnt.to_path_buf(),
        };
        let want = mnt.canonicalize().map_err(|e| e.to_string())?;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
            if mounts
                .lines()
                .any(|l| l.split(' ').nth(1) == Some(want.to_str().unwrap_or("")))
            {
                return Ok(fuse);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(
            "bindfs did not mount within 10 s: run the tests as root (mounting FUSE needs it \
             here) with fuse3 installed (apt-get install fuse3; scripts/setup.sh does)"
                .into(),
        )
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(self.server.id() as i32, sig) };
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// What a run against a hung device left: exit code (None: the process is still held by the
/// kernel, which keeps it until its IOs end), JSON results, stderr, and when they were complete.
struct Ended {
    code: Option<i32>,
    doc: serde_json::Value,
    stderr: String,
    took: Duration,
}

/// Runs `job` with the filesystem's server stopped `stop_after` into the run. The run has ended
/// when the agent exits or when its results and final words are written: the process itself
/// may stay in the kernel until the stopped server answers (any process with IO in flight
/// does, fio's too), which the test lets happen by resuming the server afterwards.
fn run_with_hang(fuse: &Fuse, dir: &Path, jobfile: &Path, stop_after: Duration) -> Ended {
    let (out, err) = (dir.join("out.json"), dir.join("stderr.txt"));
    let t = Instant::now();
    let mut agent = Command::new(bin("lockstep-agent"))
        .arg("run")
        .arg(jobfile)
        .args(["--output-format", "json", "--output"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("running lockstep-agent");
    // Stop the server only once the job's IO has begun: a stop during the layout or the
    // opening of files would hang those (which lockstep does not bound) instead of IOs.
    let pid = agent.id();
    let started = lockstep_tests::wait_for(Duration::from_secs(30), || {
        job_thread_running(pid, &job_name(jobfile), &fuse.mnt)
    });
    assert!(started, "the job thread never started");
    std::thread::sleep(stop_after);
    fuse.signal(libc::SIGSTOP);
    let mut code = None;
    loop {
        if let Some(status) = agent.try_wait().expect("waiting for the agent") {
            code = status.code();
            break;
        }
        let said = std::fs::read_to_string(&err).unwrap_or_default();
        if out.exists() && said.contains("this process may not exit") {
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            // Let the device answer so the agent can be killed, then fail.
            fuse.signal(libc::SIGCONT);
            let _ = agent.kill();
            panic!("the run did not end within 60 s of a device that stopped answering: {said}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    fuse.signal(libc::SIGCONT);
    let status = agent
        .wait()
        .expect("the agent exits once the device answers");
    let code = code.or(status.code());
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let doc = serde_json::from_slice(&std::fs::read(&out).expect("results written"))
        .expect("JSON results");
    Ended {
        code,
        doc,
        stderr,
        took,
    }
}

/// The job's name: the first section of a one-job file.
fn job_name(jobfile: &Path) -> String {
    let text = std::fs::read_to_string(jobfile).unwrap();
    let line = text.lines().find(|l| l.starts_with('[')).unwrap();
    line.trim_matches(|c| c == '[' || c == ']').to_string()
}

/// Whether process `pid` holds a file open under `dir` (as the kernel names it: canonical).
fn has_open_under(pid: u32, dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.starts_with(&dir)))
}

/// Whether the agent has the job's first clone thread (named `JOB.0`) and its files on the
/// mount are open: the thread exists from before it opens them.
fn job_thread_running(pid: u32, job: &str, mnt: &Path) -> bool {
    let want = format!("{job}.0");
    let thread = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == want));
    thread && has_open_under(pid, mnt)
}

/// A scratch directory with bindfs mounted on its `mnt`; fails the test, saying what to install
/// or enable, where that cannot be done.
fn setup(tag: &str) -> (tempfile::TempDir, Fuse) {
    let dir = scratch();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    match Fuse::mount(&src, &mnt) {
        Ok(f) => (dir, f),
        Err(why) => panic!("{tag}: cannot mount the FUSE device the test stops: {why}"),
    }
}

fn stuck_ios(job: &serde_json::Value) -> Vec<serde_json::Value> {
    job["stuck_ios"].as_array().cloned().unwrap_or_default()
}

#[test]
fn reads_from_a_device_that_stops_answering_are_given_up_after_stuck_timeout() {
    let (dir, fuse) = setup("hung-device reads");
    // A sparse 1 GiB file: every 4k random read goes to the (soon stopped) server, as the page
    // cache holds little of it.
    let data = dir.path().join("src/data");
    std::fs::File::create(&data)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let job = dir.path().join("hang.fio");
    std::fs::write(
        &job,
        format!(
            "[hang]\nfilename={}\nsize=1g\nrw=randread\nbs=4k\niodepth=8\nioengine=io_uring\n\
             runtime=3\ntime_based=1\nstuck_timeout=1s\n",
            fuse.mnt.join("data").display()
        ),
    )
    .unwrap();
    let e = run_with_hang(&fuse, dir.path(), &job, Duration::from_millis(700));
    let (took, stderr) = (e.took, &e.stderr);
    eprintln!("run ended after {took:?} (runtime 3 s, stuck_timeout 1 s); stderr: {stderr}");
    assert_eq!(e.code, Some(1), "stderr: {stderr}");
    let j = &e.doc["jobs"][0];
    let msg = j["error_message"].as_str().unwrap_or_default();
    assert!(msg.contains("the device stopped answering"), "{msg}");
    assert!(msg.contains("IO(s) still in flight"), "{msg}");
    assert_eq!(j["error"], 110, "ETIMEDOUT");
    assert!(
        j["read"]["total_ios"].as_u64().unwrap() > 0,
        "IOs before the hang are counted"
    );
    let stuck = stuck_ios(j);
    let never: Vec<_> = stuck.iter().filter(|s| s["completed"] == false).collect();
    assert!(
        !never.is_empty(),
        "the IOs given up on are listed: {stuck:?}"
    );
    assert!(never.len() <= 8, "no more than the queue depth: {stuck:?}");
    for s in &never {
        assert!(s["file"].as_str().unwrap().ends_with("mnt/data"), "{s}");
        assert!(s["latency_ms"].as_u64().unwrap() >= 1000, "{s}");
    }
    // Without the limit the run waits for SIGCONT, which comes only after it ends.
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_file_lockstep_created_on_a_device_that_stopped_answering_is_left_in_place() {
    let (dir, fuse) = setup("hung-device writes");
    let job = dir.path().join("hangw.fio");
    std::fs::write(
        &job,
        format!(
            "[hangw]\ndirectory={}\nsize=64m\nrw=randwrite\nbs=4k\niodepth=4\nioengine=io_uring\n\
             runtime=3\ntime_based=1\nstuck_timeout=1s\n",
            fuse.mnt.display()
        ),
    )
    .unwrap();
    let e = run_with_hang(&fuse, dir.path(), &job, Duration::from_millis(700));
    let stderr = &e.stderr;
    eprintln!("run ended after {:?}; stderr: {stderr}", e.took);
    assert_eq!(e.code, Some(1), "stderr: {stderr}");
    let j = &e.doc["jobs"][0];
    assert!(
        j["error_message"]
            .as_str()
            .unwrap_or_default()
            .contains("Files left in place"),
        "{j}"
    );
    assert!(stuck_ios(j).iter().any(|s| s["completed"] == false), "{j}");
    // Removing it would have waited on the stopped server; it is there, and said so.
    assert!(
        dir.path().join("src/hangw.0.0").exists(),
        "the file lockstep created was left in place"
    );
    assert!(stderr.contains("left in place"), "{stderr}");
}

#[test]
fn a_cluster_run_ends_when_one_volume_stops_answering_and_names_it() {
    use lockstep_tests::{AgentState, agent, read_results, spawn_run, start_agent};
    let dir = scratch();
    let ok = dir.path().join("ok");
    std::fs::create_dir_all(&ok).unwrap();
    let (a1, addr1) = start_agent("a1", &ok, &[]);
    let (_fdir, fuse) = setup("hung-device cluster run");
    let (a2, addr2) = start_agent("a2", &fuse.mnt, &[]);
    let procs = (a1, a2);
    // Buffered writes through FUSE go to its server one by one (no writeback cache), so once
    // it is stopped every write in flight waits for it.
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        format!(
            "name = \"hung\"\nduration = \"4s\"\ninterval = \"1s\"\n\
             [[agent]]\nname = \"a1\"\naddress = \"{addr1}\"\n\
             [[agent]]\nname = \"a2\"\naddress = \"{addr2}\"\n\
             [[role]]\nname = \"w\"\n[role.workload.fio]\nrw = \"randwrite\"\nbs = \"4k\"\n\
             iodepth = 4\nsize = \"16m\"\nstuck_timeout = \"1s\"\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("run");
    let t = Instant::now();
    let mut run = spawn_run(&plan, &out);
    // As above: stop the server once the hung agent's files are open and IO has begun.
    let a2_pid = procs.1.pid() as u32;
    let started = lockstep_tests::wait_for(Duration::from_secs(30), || {
        has_open_under(a2_pid, &fuse.mnt)
    });
    assert!(started, "agent a2 never opened its files");
    std::thread::sleep(Duration::from_millis(700));
    fuse.signal(libc::SIGSTOP);
    let ended = lockstep_tests::wait_for(Duration::from_secs(60), || {
        run.0.try_wait().ok().flatten().is_some()
    });
    let took = t.elapsed();
    fuse.signal(libc::SIGCONT);
    assert!(
        ended,
        "the cluster run did not end within 60 s of a volume that stopped answering"
    );
    eprintln!("cluster run ended after {took:?} (duration 4 s, stuck_timeout 1 s)");
    let r = read_results(&out);
    let (a1, a2) = (agent(&r, "a1"), agent(&r, "a2"));
    assert_eq!(a2.state, AgentState::Finished, "{a2:?}");
    assert!(
        a2.errors
            .iter()
            .any(|e| e.contains("the device stopped answering")),
        "{a2:?}"
    );
    assert!(a1.errors.is_empty(), "{a1:?}");
    let stuck = &r.stuck_ios;
    assert!(
        stuck.iter().any(|s| s.node == "a2" && !s.completed),
        "{stuck:?}"
    );
    assert!(stuck.iter().all(|s| s.node == "a2"), "{stuck:?}");
}
