//! Hostile job files on the real `lockstep-agent run` binary (issue 13, "Safe on a production
//! host"): each is refused with a non-zero exit and an error that names the option and line
//! (or gives both figures of an estimate), and nothing is created in the target directory.
//!
//! The agent runs with its address space limited (4 GiB) and a deadline, so a regression (an
//! include of /dev/zero read to the end, 100,000 clones set up) fails the test instead of
//! taking the machine down with it.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockstep_tests::{bin, scratch};

/// Address space the agent may use while refusing a job file.
const MEMORY_LIMIT: u64 = 4 << 30;

/// uid and gid of `nobody` (Debian's).
const NOBODY: u32 = 65534;

/// Longest a refusal may take.
const DEADLINE: Duration = Duration::from_secs(30);

struct Refusal {
    success: bool,
    stderr: String,
}

/// Runs `lockstep-agent run JOBFILE` with a memory limit and a deadline.
fn run(jobfile: &Path) -> Refusal {
    run_with(jobfile, None)
}

/// `run`, optionally as the unprivileged user `nobody` allowed `nproc` tasks (threads count).
fn run_with(jobfile: &Path, nobody_nproc: Option<u64>) -> Refusal {
    let mut cmd = Command::new(bin("lockstep-agent"));
    cmd.arg("run")
        .arg(jobfile)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit, setgroups, setgid and setuid are async-signal-safe and touch only the
    // child being started.
    unsafe {
        cmd.pre_exec(move || {
            let check = |r: libc::c_int| {
                if r != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            let limit = libc::rlimit {
                rlim_cur: MEMORY_LIMIT,
                rlim_max: MEMORY_LIMIT,
            };
            check(libc::setrlimit(libc::RLIMIT_AS, &limit))?;
            if let Some(nproc) = nobody_nproc {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(NOBODY))?;
                check(libc::setuid(NOBODY))?;
                let limit = libc::rlimit {
                    rlim_cur: nproc,
                    rlim_max: nproc,
                };
                check(libc::setrlimit(libc::RLIMIT_NPROC, &limit))?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("starting lockstep-agent");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for lockstep-agent") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lockstep-agent was still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    Refusal {
        success: status.success(),
        stderr,
    }
}

/// A scratch directory with an empty `target/` (where the job's files would go) beside the
/// job file, which is written from `options` (`{dir}` is the target directory).
fn refused(options: &str) -> (Refusal, Vec<String>) {
    let dir = scratch();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let job = dir.path().join("hostile.fio");
    let text = format!(
        "[global]\ndirectory={}\n[hostile]\n{options}\n",
        target.display()
    );
    std::fs::write(&job, text).unwrap();
    let refusal = run(&job);
    let left: Vec<String> = std::fs::read_dir(&target)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!refusal.success, "accepted: {}", refusal.stderr);
    (refusal, left)
}

#[test]
fn numjobs_100000_is_refused_at_its_line_and_nothing_is_created() {
    let (r, left) = refused("rw=write\nsize=1m\nnumjobs=100000");
    assert!(
        r.stderr
            .contains("hostile.fio:6: numjobs=100000: at most 4096"),
        "{}",
        r.stderr
    );
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn iodepth_100000_is_refused_at_its_line_and_nothing_is_created() {
    let (r, left) = refused("rw=randread\nsize=1m\nioengine=libaio\niodepth=100000");
    assert!(
        r.stderr
            .contains("hostile.fio:7: iodepth=100000: at most 65536"),
        "{}",
        r.stderr
    );
    assert_eq!(left, Vec::<String>::new());
    let (r, left) = refused("rw=randread\nsize=1m\niodepth=40000\nioengine=io_uring");
    assert!(
        r.stderr
            .contains("hostile.fio:6: iodepth=40000: at most 32768 with ioengine=io_uring"),
        "{}",
        r.stderr
    );
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn include_of_dev_zero_is_refused_naming_the_path() {
    let (r, left) = refused("rw=read\nsize=1m\ninclude /dev/zero");
    assert!(
        r.stderr
            .contains("hostile.fio:6: include /dev/zero: cannot read /dev/zero: a character device, not a regular file"),
        "{}",
        r.stderr
    );
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn a_size_bigger_than_the_free_disk_is_refused_with_both_figures() {
    let probe = scratch();
    let free = free_bytes(probe.path());
    // Twice the free space, in whole MiB; write-only, so a regression allocates rather than
    // writes.
    let size_mib = free / (1 << 20) * 2 + 1024;
    let (r, left) = refused(&format!("rw=write\nsize={size_mib}m"));
    assert!(
        r.stderr.contains("the files to lay out need ") && r.stderr.contains(" free"),
        "{}",
        r.stderr
    );
    let needed = format!("need {:.1} GiB", size_mib as f64 / 1024.0);
    assert!(r.stderr.contains(&needed), "{needed}: {}", r.stderr);
    assert!(r.stderr.contains("on the filesystem of "), "{}", r.stderr);
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn buffers_bigger_than_the_available_memory_are_refused_with_both_figures() {
    // 4096 clones x 256 deep x 16 MiB: 16 TiB of buffers.
    let (r, left) = refused("rw=write\nsize=16m\nbs=16m\nnumjobs=4096\niodepth=256");
    assert!(
        r.stderr
            .contains("the jobs need 16400.0 GiB of memory (16384.0 GiB of IO buffers"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("GiB available (MemAvailable)"),
        "{}",
        r.stderr
    );
    assert_eq!(left, Vec::<String>::new());
}

/// A clone whose thread cannot be started (the user's task limit is reached) ends the run with
/// an error naming the clone, instead of a panic, and the clones already started do not wait
/// for it forever. Needs root, to run the agent as an unprivileged user whose limit holds.
#[test]
fn a_clone_thread_that_cannot_start_is_an_error_not_a_panic() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root, to run the agent as nobody with a task limit: run the suite as \
         root (scripts/test.sh does on CI)"
    );
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).unwrap();
    let job = dir.path().join("clones.fio");
    std::fs::write(
        &job,
        format!(
            "[j]\ndirectory={}\nrw=write\nsize=1m\nnumjobs=4\nruntime=2\ntime_based\n",
            target.display()
        ),
    )
    .unwrap();
    // Four tasks: the main thread and three clones; the fourth clone cannot start.
    let r = run_with(&job, Some(4));
    assert!(!r.success, "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("job 'j' (clone 3): cannot start the clone's thread"),
        "{}",
        r.stderr
    );
    let left: Vec<_> = std::fs::read_dir(&target).unwrap().collect();
    assert_eq!(left.len(), 0, "files left behind");
}

fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs reads a NUL-terminated path and writes one struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail as u64 * st.f_frsize as u64
}

/// The agent daemon, driven by the coordinator (`lockstep run --local 1`), refuses the same
/// way in its prepare step: the coordinator reports the agent's error with both figures, and
/// the agent's volume (kept with --keep-files, to look at) holds no file.
#[test]
fn the_daemon_refuses_a_size_bigger_than_the_free_disk_before_io() {
    let dir = scratch();
    let free = free_bytes(dir.path());
    let size_mib = free / (1 << 20) * 2 + 1024;
    std::fs::write(
        dir.path().join("big.fio"),
        format!("[w]\nrw=write\nioengine=psync\nsize={size_mib}m\n"),
    )
    .unwrap();
    let (o, out) = lockstep_tests::run_plan(
        dir.path(),
        "duration = \"2s\"\n[[role]]\nname = \"w\"\nworkload = { jobfile = \"big.fio\" }\n",
        Some(1),
        &["--keep-files"],
    );
    let text = lockstep_tests::output_text(&o);
    assert!(!o.status.success(), "{text}");
    let needed = format!(
        "the files to lay out need {:.1} GiB",
        size_mib as f64 / 1024.0
    );
    assert!(text.contains(&needed), "{needed}: {text}");
    assert!(text.contains(" free"), "{text}");
    let volumes = out.join("volumes");
    let mut files = Vec::new();
    for agent in std::fs::read_dir(&volumes).unwrap() {
        for f in std::fs::read_dir(agent.unwrap().path()).unwrap() {
            files.push(f.unwrap().path());
        }
    }
    assert_eq!(files, Vec::<std::path::PathBuf>::new());
}
