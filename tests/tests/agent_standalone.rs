//! `lockstep-agent run JOBFILE`: real files with O_DIRECT, fio's JSON, job files from the seeds,
//! and bad input refused before any IO.

use std::path::Path;
use std::process::Command;

use lockstep_tests::{bin, scratch};

fn run(jobfile: &Path, dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(bin("lockstep-agent"))
        .arg("run")
        .arg(jobfile)
        .args(["--output-format", "json"])
        .args(extra)
        .env("LOCKSTEP_DIR", dir)
        .output()
        .expect("running lockstep-agent")
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {} stderr {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn repo(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

#[test]
fn direct_io_uring_randread_produces_fio_json_and_cleans_up() {
    let dir = scratch();
    let job = dir.path().join("j.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\ndirectory={}\nioengine=io_uring\ndirect=1\n[rr]\nrw=randread\nbs=4k\niodepth=8\nsize=16m\nruntime=2\ntime_based\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let o = run(&job, dir.path(), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&o);
    let j = &v["jobs"][0];
    assert_eq!(j["jobname"], "rr");
    let read = &j["read"];
    assert!(read["iops"].as_f64().unwrap() > 0.0);
    assert!(read["total_ios"].as_u64().unwrap() > 0);
    assert_eq!(
        read["io_bytes"].as_u64().unwrap(),
        read["total_ios"].as_u64().unwrap() * 4096
    );
    assert!(read["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
    assert_eq!(j["write"]["total_ios"].as_u64().unwrap(), 0);
    // The file it laid out is gone; only the job file is left.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("j.fio")]);
}

#[test]
fn the_seed_job_files_run_unmodified_apart_from_size() {
    let dir = scratch();
    for (file, size) in [
        ("agent/tests/jobs/hadoop-randread.fio", "64m"),
        ("agent/tests/jobs/hadoop-randwrite.fio", "64m"),
    ] {
        // The appendix jobs name /ebs0: point them at the scratch directory and scale them
        // down, as the issue allows ("unmodified apart from size").
        let o = run(
            &repo(file),
            dir.path(),
            &[
                "--set",
                &format!("directory={}", dir.path().display()),
                "--set",
                &format!("size={size}"),
                "--set",
                "bs=1m",
            ],
        );
        assert!(
            o.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v = json(&o);
        let ios: u64 = ["read", "write"]
            .iter()
            .map(|d| v["jobs"][0][d]["total_ios"].as_u64().unwrap())
            .sum();
        assert_eq!(ios, 64, "{file}: one pass of 64 MiB in 1 MiB blocks");
    }
    for file in [
        "examples/jobs/alteryx-randrw.fio",
        "examples/jobs/alteryx-seqwrite.fio",
    ] {
        let o = run(
            &repo(file),
            dir.path(),
            &["--set", "size=32m", "--set", "runtime=2"],
        );
        assert!(
            o.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v = json(&o);
        let bytes: u64 = v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                j["read"]["io_bytes"].as_u64().unwrap() + j["write"]["io_bytes"].as_u64().unwrap()
            })
            .sum();
        assert!(bytes > 0, "{file}");
    }
}

#[test]
fn null_engine_and_verify_run_clean() {
    let dir = scratch();
    let o = run(
        &repo("examples/jobs/null-4k.fio"),
        dir.path(),
        &["--set", "runtime=1"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(json(&o)["jobs"][0]["read"]["iops"].as_f64().unwrap() > 10_000.0);
    let job = dir.path().join("v.fio");
    std::fs::write(
        &job,
        format!(
            "[v]\ndirectory={}\nrw=randwrite\nbs=4k\nsize=4m\nverify=crc32c\nioengine=psync\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let o = run(&job, dir.path(), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json(&o)["jobs"][0]["error"], 0);
}

#[test]
fn bad_input_is_refused_with_file_line_and_option_before_any_io() {
    let dir = scratch();
    let job = dir.path().join("bad.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\ndirectory={}\n\n[j]\nrw=randread\niodepth_batch=4\nsize=4m\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let o = run(&job, dir.path(), &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.fio:6") && err.contains("iodepth_batch"),
        "{err}"
    );
    // Nothing was written next to the job file.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let job = dir.path().join("missing.fio");
    std::fs::write(
        &job,
        "[j]\ndirectory=/nonexistent/lockstep-dir\nrw=read\nsize=1m\n",
    )
    .unwrap();
    let o = run(&job, dir.path(), &[]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/lockstep-dir"), "{err}");

    let o = run(
        &repo("examples/jobs/null-4k.fio"),
        dir.path(),
        &["--set", "bs=4q"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--set bs=4q"));
}

/// Runs a 4 s buffered randwrite job with verify=crc32c and `extra_option`, and zeroes its
/// file 1.5 s into the run from outside: the blocks written before that and not rewritten
/// after are bad when the job verifies them at its end. Returns the run's output.
fn verify_with_corruption(extra_option: &str) -> std::process::Output {
    let dir = scratch();
    let job = dir.path().join("v.fio");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        &job,
        format!(
            "[v]\ndirectory={}\nrw=randwrite\nbs=4k\nsize=16m\nverify=crc32c\nioengine=psync\n\
             rate_iops=400\ntime_based=1\nruntime=4\n{extra_option}\n",
            data.display()
        ),
    )
    .unwrap();
    let child = Command::new(bin("lockstep-agent"))
        .arg("run")
        .arg(&job)
        .args(["--output-format", "json"])
        .env("LOCKSTEP_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running lockstep-agent");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let file = loop {
        let found = std::fs::read_dir(&data)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.metadata().is_ok_and(|m| m.len() == 16 << 20));
        if let Some(f) = found {
            break f;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job never laid out its file"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // Overwrite in place (no truncation): the job's fd keeps writing into the same file.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all_at(&vec![0u8; 16 << 20], 0).unwrap();
    drop(f);
    child.wait_with_output().unwrap()
}

/// fio's continue_on_error=verify: verify mismatches are counted (total_err, first_error
/// EILSEQ) and the job ends without an error; without it, the same mismatches fail the job.
#[test]
fn continue_on_error_verify_counts_mismatches_instead_of_failing() {
    let o = verify_with_corruption("continue_on_error=verify");
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{stderr}");
    let j = &json(&o)["jobs"][0];
    println!(
        "with continue_on_error=verify: total_err {} first_error {}",
        j["total_err"], j["first_error"]
    );
    assert!(j["total_err"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["first_error"], 84, "EILSEQ, fio's verify error");
    assert_eq!(j["error"], 84, "fio reports the first error as the job's");
    assert!(j.get("error_message").is_none(), "{j}");
    assert_eq!(j["job options"]["continue_on_error"], "verify");

    // continue_on_error=io does not cover verify errors: the job fails, as without the option.
    let o = verify_with_corruption("continue_on_error=io");
    assert!(!o.status.success());
    let j = &json(&o)["jobs"][0];
    assert_eq!(j["error"], 84);
    assert!(
        j["error_message"]
            .as_str()
            .unwrap()
            .contains("verify (crc32c) failed"),
        "{j}"
    );
    assert_eq!(
        j["total_err"], 0,
        "fio counts no error of a kind it does not go on for"
    );
}
