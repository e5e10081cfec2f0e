//! The agent touches only what it was given: links, FIFOs and hard links planted in a daemon's
//! volume are refused and what they point at is unchanged; a local job never grows or
//! overwrites a file it did not create unless the job says so; output paths are checked before
//! any IO and device nodes are never replaced; a full results disk keeps the report.

use std::os::unix::fs::{FileTypeExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lockstep_tests::{bin, output_text, scratch, start_agent};

fn checksum(path: &Path) -> (u64, u32) {
    let bytes = std::fs::read(path).unwrap();
    (bytes.len() as u64, crc32(&bytes))
}

/// A small CRC, enough to tell whether a file's bytes changed.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (!(crc & 1)).wrapping_add(1));
        }
    }
    !crc
}

fn plan(dir: &Path, address: &str, rw: &str) -> PathBuf {
    let text = format!(
        "name = \"confine\"\nduration = \"2s\"\ninterval = \"1s\"\n\n[[agent]]\nname = \"a1\"\n\
         address = \"{address}\"\n\n[[role]]\nname = \"w\"\n[role.workload.fio]\nrw = \"{rw}\"\n\
         bs = \"4k\"\niodepth = 2\nsize = \"4m\"\n"
    );
    let p = dir.join(format!("plan-{rw}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn run(plan: &Path, out: &Path) -> Output {
    Command::new(bin("lockstep"))
        .arg("run")
        .arg(plan)
        .arg("--output")
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The names a one-job plan makes in its volume (fio's `job.clone.file`).
const TARGET: &str = "w.0.0";

#[test]
fn a_daemon_refuses_links_fifos_and_hard_links_in_its_volume_and_leaves_their_targets_alone() {
    let dir = scratch();
    let vol = dir.path().join("vol");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let victim = outside.join("precious");
    std::fs::write(&victim, vec![7u8; 1 << 20]).unwrap();
    let before = checksum(&victim);
    let (_agent, addr) = start_agent("a1", &vol, &[]);
    let target = vol.join(TARGET);

    type Plant = fn(&Path, &Path);
    let cases: [(&str, Plant, &str); 4] = [
        (
            "a link to a file outside",
            |t, v| symlink(v, t).unwrap(),
            "symbolic link",
        ),
        (
            "a dangling link",
            |t, v| symlink(v.with_file_name("created-through-link"), t).unwrap(),
            "symbolic link",
        ),
        (
            "a FIFO",
            |t, _| {
                let c = std::ffi::CString::new(t.to_str().unwrap()).unwrap();
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            },
            "FIFO",
        ),
        (
            "a hard link to a file outside",
            |t, v| std::fs::hard_link(v, t).unwrap(),
            "hard links",
        ),
    ];
    for rw in ["randwrite", "randread"] {
        let plan = plan(dir.path(), &addr, rw);
        for (i, (what, plant, says)) in cases.iter().enumerate() {
            plant(&target, &victim);
            let o = run(&plan, &dir.path().join(format!("run-{rw}-{i}")));
            let text = output_text(&o);
            assert_eq!(o.status.code(), Some(2), "{rw}, {what}: {text}");
            assert!(
                text.contains(says) && text.contains(target.to_str().unwrap()),
                "{rw}, {what}: the error must name the path and say why: {text}"
            );
            assert_eq!(
                checksum(&victim),
                before,
                "{rw}, {what}: the outside file changed"
            );
            assert!(
                !outside.join("created-through-link").exists(),
                "{rw}, {what}: a file was created outside the volume"
            );
            std::fs::remove_file(&target).unwrap();
        }
    }
    // With nothing planted, the same agent runs the same plan and cleans up after itself.
    let o = run(
        &plan(dir.path(), &addr, "randwrite"),
        &dir.path().join("clean"),
    );
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(
        std::fs::read_dir(&vol).unwrap().count(),
        0,
        "files left in the volume"
    );
}

fn agent_run(job: &Path, extra: &[&str]) -> Output {
    Command::new(bin("lockstep-agent"))
        .arg("run")
        .arg(job)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_local_job_never_grows_or_overwrites_a_file_it_did_not_create_unless_told_to() {
    let dir = scratch();
    let existing = dir.path().join("passwd");
    std::fs::write(&existing, b"root:x:0:0:root:/root:/bin/bash\n".repeat(4)).unwrap();
    let before = checksum(&existing);
    let job = dir.path().join("job.fio");
    let write_job = |rw: &str, extra: &str| {
        std::fs::write(
            &job,
            format!(
                "[j]\nfilename={}\nrw={rw}\nbs=4k\nsize=1m\nio_size=64k\n{extra}",
                existing.display()
            ),
        )
        .unwrap();
    };
    write_job("read", "");
    let o = agent_run(&job, &[]);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(
        text.contains("does not extend") && text.contains("passwd"),
        "{text}"
    );
    assert_eq!(checksum(&existing), before, "a read job changed a file");

    write_job("randwrite", "");
    let o = agent_run(&job, &[]);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("overwrite=1"), "{text}");
    assert_eq!(
        checksum(&existing),
        before,
        "a write job wrote a file it did not create"
    );

    // Said in the job, fio's way: the file is the job's to grow and write.
    write_job("randwrite", "overwrite=1\n");
    let o = agent_run(&job, &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert_eq!(std::fs::metadata(&existing).unwrap().len(), 1 << 20);

    // A file that does not exist and may not be created.
    std::fs::write(
        &job,
        format!(
            "[j]\nfilename={}\nrw=write\nsize=64k\nallow_file_create=0\n",
            dir.path().join("new").display()
        ),
    )
    .unwrap();
    let o = agent_run(&job, &[]);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("allow_file_create=0"), "{text}");
    assert!(!dir.path().join("new").exists());
}

#[test]
fn output_paths_are_checked_before_any_io_and_device_nodes_are_never_replaced() {
    let dir = scratch();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let job = dir.path().join("job.fio");
    std::fs::write(
        &job,
        format!(
            "[j]\ndirectory={}\nrw=randwrite\nbs=4k\nsize=4m\nruntime=1\ntime_based=1\n",
            work.display()
        ),
    )
    .unwrap();

    // A missing directory: refused before any IO, with the path named.
    let missing = dir.path().join("no/such/dir/out.json");
    let t = std::time::Instant::now();
    let o = agent_run(&job, &["--output", missing.to_str().unwrap()]);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(
        text.contains(missing.parent().unwrap().to_str().unwrap()),
        "{text}"
    );
    assert!(
        t.elapsed().as_secs_f64() < 1.0,
        "the job ran before the output path was checked"
    );
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "IO happened");

    // A directory is refused; /dev/null is written into and stays a device.
    let o = agent_run(&job, &["--output", work.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    let o = agent_run(&job, &["--output", "/dev/null"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );

    // /dev/full: the write fails, the report still reaches stdout and the error names it.
    let o = agent_run(&job, &["--output", "/dev/full", "--output-format", "json"]);
    let text = output_text(&o);
    assert_ne!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("/dev/full"), "{text}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"jobs\""),
        "{text}"
    );
    assert!(
        std::fs::metadata("/dev/full")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

/// A small tmpfs, unmounted when the test ends, pass or fail.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: &Path, size: &str) -> SmallFs {
        std::fs::create_dir_all(at).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("mount(8) from util-linux: apt-get install mount");
        assert!(
            o.status.success(),
            "mounting a tmpfs needs root (the test suite runs as root): {}",
            output_text(&o)
        );
        SmallFs(at.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_or_read_only_results_disk_keeps_the_report_and_names_the_path() {
    let dir = scratch();
    let vol = dir.path().join("vol");
    std::fs::create_dir_all(&vol).unwrap();
    let (_agent, addr) = start_agent("a1", &vol, &[]);
    let plan = plan(dir.path(), &addr, "randread");

    let full = SmallFs::mount(&dir.path().join("full"), "64k");
    std::fs::write(full.0.join("filler"), vec![0u8; 60 << 10]).unwrap();
    let out = full.0.join("run");
    let o = run(&plan, &out);
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains("results.json") && text.contains("No space left"),
        "{text}"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("all volumes"),
        "the report must reach stdout: {text}"
    );

    // A read-only results directory is refused before any IO.
    let ro = SmallFs::mount(&dir.path().join("ro"), "64k");
    let o = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&ro.0)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    let t = std::time::Instant::now();
    let o = run(&plan, &ro.0.join("run"));
    let text = output_text(&o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains(ro.0.to_str().unwrap()), "{text}");
    assert!(
        !text.contains("run: started"),
        "IO began before the check: {text}"
    );
    assert!(t.elapsed().as_secs() < 2, "refused only after the run");
}

/// `--local` agents get volumes under the results directory; a relative `--output` (the
/// quickstart's default) must work with opens confined beneath them.
#[test]
fn a_local_run_with_a_relative_results_directory_works() {
    let dir = scratch();
    std::fs::write(
        dir.path().join("plan.toml"),
        "name = \"rel\"\nduration = \"2s\"\ninterval = \"1s\"\n\n[[role]]\nname = \"w\"\n\
         [role.workload.fio]\nrw = \"randwrite\"\nbs = \"4k\"\niodepth = 2\nsize = \"4m\"\n",
    )
    .unwrap();
    let o = Command::new(bin("lockstep"))
        .args(["run", "--local", "2", "plan.toml", "--output", "out"])
        .current_dir(dir.path())
        .env("LOCKSTEP_AGENT_BIN", bin("lockstep-agent"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(dir.path().join("out/results.json").is_file());
}
