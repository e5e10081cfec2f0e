//! Failure drills end to end: real agents on real files, open-loop rate, every fault kind,
//! the drill report, stuck IOs and exact verification.
//!
//! The tests share two cores and some assert timing (rate accuracy, when a gp2 model runs out
//! of credits), so they run one at a time (`SERIAL`). Every figure a test asserts is printed,
//! so `cargo test --test drills -- --nocapture` shows what was measured. The 1% rate figure and
//! the 60x gp2 figure are measured by `scripts/drill-figures.sh` (release build, longer runs);
//! the bounds here are looser because CI machines are noisy.

use std::path::{Path, PathBuf};
use std::process::Command;

use lockstep::results::drill::{DrillTarget, Percentiles, WindowStats};
use lockstep::results::timeline::VolumePoint;
use lockstep::results::{RunResults, Summary};
use lockstep_agent::verify::{BlockRef, VerifyReport};
use lockstep_tests::{
    RunStatus, agent, bin, output_text, read_json, read_results, read_timeline, run_plan, scratch,
    serial, start_agent,
};

/// The summary of `node`'s volume.
fn volume<'a>(r: &'a RunResults, node: &str) -> &'a Summary {
    &r.volumes
        .iter()
        .find(|v| v.node == node)
        .unwrap_or_else(|| panic!("no volume of {node}"))
        .summary
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The drill entry of the fault on `node`.
fn drill<'a>(r: &'a RunResults, node: &str) -> &'a DrillTarget {
    r.drill
        .as_ref()
        .expect("a drill report")
        .faults
        .iter()
        .flat_map(|f| &f.volumes)
        .find(|v| v.target.starts_with(&format!("{node}/")))
        .unwrap_or_else(|| panic!("no drill entry for {node}"))
}

/// A drill window that must be there: before, during or after the fault.
fn window<'a>(w: &'a Option<WindowStats>, which: &str) -> &'a WindowStats {
    w.as_ref()
        .unwrap_or_else(|| panic!("no {which} window in the drill entry"))
}

/// Latency from the intended issue of a drill window (open-loop workloads).
fn intended(w: &WindowStats) -> &Percentiles {
    w.lat_intended
        .as_ref()
        .expect("open-loop latency in the drill window")
}

/// Per-interval IOPS of a volume from timeline.json: (interval start s, IOPS).
/// A node's measured points from timeline.json. The last interval may be a few ms long (IOs
/// finishing after the runtime) and is left out.
fn timeline_points(out: &Path, node: &str) -> Vec<VolumePoint> {
    let t = read_timeline(out);
    let v = t.volumes.iter().find(|v| v.node == node).unwrap();
    v.points
        .iter()
        .filter(|p| p.len_ms >= 500)
        .copied()
        .collect()
}

/// A point's start (s) and IOPS.
fn point_start_and_iops(p: &VolumePoint) -> (f64, f64) {
    let len = p.len_ms as f64;
    let ios = (p.ios[0] + p.ios[1]) as f64;
    ((p.t_ms as f64 - len) / 1000.0, ios * 1000.0 / len)
}

fn iops_series(out: &Path, node: &str) -> Vec<(f64, f64)> {
    timeline_points(out, node)
        .iter()
        .map(point_start_and_iops)
        .collect()
}

/// (a) and (b): 5,000 IOPS per volume, open loop, on the local disk; a 200 ms stall on one
/// volume shows in the corrected p99.9 and hides in the uncorrected one.
#[test]
fn open_loop_rate_holds_and_a_stall_shows_only_in_corrected_latency() {
    let _g = serial();
    let dir = scratch();
    let plan = r#"
name = "rate5k"
duration = "12s"
[[role]]
name = "db"
rate_iops = 5000
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 32
size = "64m"
ioengine = "io_uring"
direct = 1
[[fault]]
at = "6s"
duration = "200ms"
target = { agents = ["agent-2"] }
kind = "stall"
"#;
    let (o, out) = run_plan(dir.path(), plan, Some(2), &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let r = read_results(&out);
    // (a) the rate: the clean volume did 5,000 IOPS.
    let clean = &volume(&r, "agent-1").total;
    let iops = clean.iops;
    let err = (iops - 5000.0).abs() / 5000.0 * 100.0;
    println!(
        "rate: target 5000 IOPS, achieved {iops:.1} IOPS ({err:.2}% off) over {} IOs",
        clean.ios
    );
    assert!(err < 3.0, "achieved {iops} IOPS for a 5,000 target");
    // Open loop: even the stalled volume catches up and keeps the rate over the run.
    let stalled = &volume(&r, "agent-2").total;
    assert!((stalled.iops - 5000.0).abs() < 150.0, "{}", stalled.iops);
    // (b) the stall: corrected latency shows it, uncorrected hides it. The stall delays the
    // ~1,000 IOs scheduled in its 200 ms (1.7% of the run's 60,000) by 0-200 ms each, so the
    // corrected p99 is near 80 ms and its p99.9 near 200 ms. Measured from actual issue, only
    // the <= 32 IOs in flight when it began (0.05%) wait: p99 stays at the device's latency.
    // (The uncorrected p99.9 is the 28th slowest IO outside the stall, i.e. the host's noise:
    // 8-17 ms alone, 71 ms once on a busy CI host, so it is printed, not asserted.)
    let pct = |lat: &str, p: &str| {
        let summary = match lat {
            "lat_intended" => stalled.lat_intended.as_ref().expect("open-loop latency"),
            _ => &stalled.lat,
        };
        ms(summary.percentiles[p])
    };
    let (corrected, uncorrected) = (pct("lat_intended", "99.900000"), pct("lat", "99.900000"));
    let (corrected99, uncorrected99) = (pct("lat_intended", "99.000000"), pct("lat", "99.000000"));
    println!(
        "200 ms stall: p99.9 from intended issue {corrected:.1} ms, from actual issue {uncorrected:.1} ms; \
         p99 {corrected99:.1} / {uncorrected99:.1} ms"
    );
    assert!(
        corrected >= 150.0,
        "corrected p99.9 {corrected} ms should show the 200 ms stall"
    );
    assert!(
        corrected99 >= 30.0,
        "corrected p99 {corrected99} ms should show the 200 ms stall"
    );
    assert!(
        uncorrected99 < corrected99 / 3.0,
        "uncorrected p99 {uncorrected99} ms should hide the stall ({corrected99} ms)"
    );
    // The drill report: the interval of the stall, and its recovery.
    let d = drill(&r, "agent-2");
    let during = window(&d.during, "during");
    println!("drill: {d:#?}");
    assert!(ms(intended(during).p99_ns) >= 150.0, "{during:?}");
    assert!(window(&d.baseline, "baseline").iops > 4500.0);
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("stall on agent-2/data"), "{report}");
}

/// (c) A 60 GiB gp2 model driven at 3,000 IOPS falls to its 180 IOPS baseline when its
/// 5.4M credits run out: 5.4M / (3000 - 180) / time_scale seconds after its start.
#[test]
fn gp2_falls_to_its_baseline_when_the_model_predicts() {
    let _g = serial();
    let dir = scratch();
    let time_scale = 240.0;
    let predicted = 5.4e6 / (3000.0 - 180.0) / time_scale;
    let plan = format!(
        r#"
name = "gp2"
duration = "14s"
[[role]]
name = "w"
rate_iops = 3000
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 64
size = "64m"
ioengine = "io_uring"
direct = 1
[[fault]]
at = "0s"
target = {{}}
kind = "ebs"
volume_type = "gp2"
size_gib = 60
time_scale = {time_scale}
"#
    );
    let (o, out) = run_plan(dir.path(), &plan, Some(1), &[]);
    assert!(
        o.status.success() || o.status.code() == Some(1),
        "{}",
        output_text(&o)
    );
    let series = iops_series(&out, "agent-1");
    println!(
        "gp2 60 GiB at 3000 IOPS, credits x{time_scale}: IOPS per interval {:?}",
        series.iter().map(|s| s.1.round()).collect::<Vec<_>>()
    );
    // The first interval mostly below half the burst rate is the fall.
    let fall = series
        .iter()
        .position(|s| s.1 < 1500.0)
        .expect("IOPS never fell");
    // The fall happens inside interval `fall`: its start is at most 1 interval before.
    let fell_at = series[fall].0 + (series[fall].1 - 180.0).max(0.0) / (3000.0 - 180.0);
    println!(
        "gp2 cliff: predicted t={predicted:.2}s, measured t={fell_at:.2}s (interval starting {:.0}s)",
        series[fall].0
    );
    assert!(
        (fell_at - predicted).abs() <= 2.0,
        "fell at {fell_at:.2}s, predicted {predicted:.2}s"
    );
    assert!(
        series[..fall].iter().all(|s| s.1 > 2700.0),
        "burst before the fall: {series:?}"
    );
    let after: Vec<f64> = series[fall + 1..].iter().map(|s| s.1).collect();
    assert!(after.len() >= 3, "{series:?}");
    for x in &after {
        assert!(
            (150.0..=215.0).contains(x),
            "baseline after the fall should be ~180 IOPS: {after:?}"
        );
    }
}

/// (d) drop_writes on 1% of writes: the verifier finds exactly the blocks whose last
/// acknowledged write was dropped, in the run and again later from the saved state; a clean
/// run finds nothing.
#[test]
fn verification_finds_exactly_the_dropped_writes_and_nothing_on_a_clean_run() {
    let _g = serial();
    let dir = scratch();
    let vol = dir.path().join("vol");
    std::fs::create_dir_all(&vol).unwrap();
    let (_agent, addr) = start_agent("a1", &vol, &[]);
    let plan = |fault: &str| {
        format!(
            r#"
name = "verify"
duration = "5s"
[[agent]]
name = "a1"
address = "{addr}"
[[role]]
name = "w"
rate_iops = 2000
[role.workload.fio]
rw = "randwrite"
bs = "4k"
iodepth = 32
size = "8m"
ioengine = "io_uring"
direct = 1
verify = "crc32c"
{fault}
"#
        )
    };
    let drop = "[[fault]]\nat = \"1s\"\ntarget = {}\nkind = \"drop_writes\"\nfraction = 0.01\n";
    let d1 = dir.path().join("drop");
    std::fs::create_dir_all(&d1).unwrap();
    let (o, out) = run_plan(&d1, &plan(drop), None, &["--keep-files"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "lost writes must fail the run: {}",
        output_text(&o)
    );
    let r = read_results(&out);
    let v = &r.verify[0].report;
    let set =
        |blocks: &mut dyn Iterator<Item = BlockRef>| -> std::collections::BTreeSet<(String, u64)> {
            blocks.map(|b| (b.file, b.offset)).collect()
        };
    let findings = |v: &VerifyReport| {
        set(&mut v.findings.iter().map(|f| BlockRef {
            file: f.file.clone(),
            offset: f.offset,
        }))
    };
    let found = findings(v);
    let dropped = set(&mut v.dropped_blocks.iter().cloned());
    println!(
        "drop_writes 1%: {} writes dropped, {} blocks left without their last acknowledged write; verifier: {} lost, {} stale, {} corrupt of {} blocks",
        v.dropped_writes,
        dropped.len(),
        v.lost,
        v.stale,
        v.corrupt,
        v.blocks
    );
    assert!(dropped.len() >= 5, "expected ~1% of 2048 blocks: {v:?}");
    assert_eq!(
        found, dropped,
        "the verifier must find exactly the dropped blocks"
    );
    assert_eq!(v.lost + v.stale, dropped.len() as u64);
    assert_eq!(v.corrupt, 0);
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(
        report.contains("verify (crc32c") && report.contains("FAILED"),
        "{report}"
    );
    // After a restart: the saved state, re-checked by another process, finds the same.
    let o2 = Command::new(bin("lockstep-agent"))
        .args(["verify", "--json"])
        .arg(&vol)
        .output()
        .unwrap();
    assert_eq!(o2.status.code(), Some(1), "{}", output_text(&o2));
    let later: VerifyReport = serde_json::from_slice(&o2.stdout).unwrap();
    assert_eq!(findings(&later), dropped);
    // The clean run: zero, and exit 0.
    for e in std::fs::read_dir(&vol).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let d2 = dir.path().join("clean");
    std::fs::create_dir_all(&d2).unwrap();
    let (o, out) = run_plan(&d2, &plan(""), None, &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let clean = read_results(&out);
    let v = &clean.verify[0].report;
    println!(
        "clean run: {} blocks, {} lost, {} stale, {} corrupt",
        v.blocks, v.lost, v.stale, v.corrupt
    );
    assert!(v.blocks > 1000);
    assert_eq!((v.lost, v.stale, v.corrupt), (0, 0, 0));
    assert_eq!(v.good, v.blocks);
    // Without --keep-files nothing is left behind, state files included.
    assert_eq!(std::fs::read_dir(&vol).unwrap().count(), 0);
}

/// (e) The IO-path faults not covered above, one per volume, each seen in the drill report:
/// iops_cap, bw_cap, latency, eio. Plus stuck IOs from a stall longer than the timeout.
#[test]
fn every_io_path_fault_shows_its_effect_in_the_drill_report() {
    let _g = serial();
    let dir = scratch();
    let plan = r#"
name = "faults"
duration = "8s"
[[role]]
name = "db"
rate_iops = 1000
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 32
size = "16m"
ioengine = "io_uring"
direct = 1
stuck_timeout = "500ms"
[[fault]]
at = "2s"
duration = "3s"
target = { agents = ["agent-1"] }
kind = "iops_cap"
total = 200
[[fault]]
at = "2s"
duration = "3s"
target = { agents = ["agent-2"] }
kind = "bw_cap"
total_bytes_per_s = 1000000
[[fault]]
at = "2s"
duration = "3s"
target = { agents = ["agent-3"] }
kind = "latency"
add_us = 20000
[[fault]]
at = "2s"
duration = "3s"
target = { agents = ["agent-4"] }
kind = "stall"
[[fault]]
at = "2s"
duration = "3s"
target = { agents = ["agent-5"] }
kind = "eio"
fraction = 0.05
"#;
    let (o, out) = run_plan(dir.path(), plan, Some(5), &[]);
    let r = read_results(&out);
    let report = String::from_utf8_lossy(&o.stdout).to_string();
    // A fault's baseline and during windows.
    let show = |node: &str, what: &str| {
        let d = drill(&r, node);
        let (before, during) = (window(&d.baseline, "baseline"), window(&d.during, "during"));
        println!(
            "{what}: baseline {:.0} IOPS p50 {:.2} ms -> during {:.0} IOPS p50 {:.2} ms, {} errors",
            before.iops,
            ms(before.lat.p50_ns),
            during.iops,
            ms(during.lat.p50_ns),
            during.errors
        );
        (before.clone(), during.clone(), d.clone())
    };
    let (cap_before, cap, _) = show("agent-1", "iops_cap total=200");
    assert!(cap_before.iops > 900.0);
    assert!(cap.iops < 280.0, "{cap:?}");
    let (_, bw, _) = show("agent-2", "bw_cap 1 MB/s (244 IOPS of 4 KiB)");
    assert!(bw.iops < 320.0, "{bw:?}");
    let (lat_before, lat, _) = show("agent-3", "latency +20 ms");
    assert!(ms(lat.lat.p50_ns) >= 20.0, "{lat:?}");
    assert!(ms(lat_before.lat.p50_ns) < 10.0, "{lat_before:?}");
    // A 3 s stall with a 500 ms stuck timeout: nothing completes during it, the held IOs
    // land right after it (and carry the whole wait), and they are listed as stuck.
    let (_, stall_during, stall) = show("agent-4", "stall 3 s");
    assert!(stall_during.iops < 50.0, "{stall:?}");
    let stall_after = intended(window(&stall.after, "after")).p99_ns;
    println!(
        "stall 3 s: after it, p99 from intended issue {:.0} ms",
        ms(stall_after)
    );
    assert!(ms(stall_after) >= 2000.0, "{stall:?}");
    let stuck: Vec<_> = r.stuck_ios.iter().filter(|s| s.node == "agent-4").collect();
    println!(
        "stuck IOs on agent-4: {} listed, e.g. {}",
        stuck.len(),
        stuck.first().map_or("none".into(), |s| format!("{s:?}"))
    );
    assert!(!stuck.is_empty(), "the stall's IOs must be listed as stuck");
    assert!(
        stuck
            .iter()
            .all(|s| s.latency_ms >= 500 && (1900..=3100).contains(&s.start_ms))
    );
    assert!(report.contains("stuck IOs"), "{report}");
    assert!(
        r.stuck_ios.iter().all(|s| s.node == "agent-4"),
        "only the stalled volume had stuck IOs"
    );
    // EIO ends the job at its first error (fio's continue_on_error=none): the error is
    // counted in the fault's window and named in the agent's errors.
    let (eio_before, eio, _) = show("agent-5", "eio 5%");
    assert!(eio.errors >= 1, "{eio:?}");
    assert_eq!(eio_before.errors, 0);
    let a5 = agent(&r, "agent-5");
    assert!(
        a5.errors.iter().any(|e| e.contains("Input/output error")),
        "{a5:?}"
    );
    for kind in [
        "iops_cap on agent-1/data",
        "bw_cap on agent-2/data",
        "latency on agent-3/data",
        "stall on agent-4/data",
        "eio on agent-5/data",
    ] {
        assert!(
            report.contains(kind),
            "missing '{kind}' in the report:\n{report}"
        );
    }
}

/// fio's `continue_on_error=all` keeps an EIO drill running: one volume of two fails 5% of its
/// IOs with EIO for most of the run; its job counts the errors in every interval of the fault,
/// keeps issuing IOs after the first one, and runs the whole duration with no agent error.
#[test]
fn continue_on_error_keeps_an_eio_drill_running_and_counts_every_error() {
    let _g = serial();
    let dir = scratch();
    let plan = r#"
name = "coe"
duration = "6s"
[[role]]
name = "db"
rate_iops = 500
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 8
size = "16m"
ioengine = "io_uring"
direct = 1
continue_on_error = "all"
[[fault]]
at = "1s"
duration = "4s"
target = { agents = ["agent-2"] }
kind = "eio"
fraction = 0.05
"#;
    let (o, out) = run_plan(dir.path(), plan, Some(2), &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let r = read_results(&out);
    assert_eq!(r.status, RunStatus::Completed, "{}", r.status_reason);
    for a in &r.agents {
        assert!(a.errors.is_empty(), "{a:?}");
    }
    // Per interval, on the failing volume: errors in each second of the fault, IO in every
    // interval until the end of the run (after the first error and after the fault).
    let points = timeline_points(&out, "agent-2");
    let series: Vec<(u64, u64, u64)> = points
        .iter()
        .map(|p| (p.t_ms, p.ios[0] + p.ios[1], p.errors[0] + p.errors[1]))
        .collect();
    println!("agent-2 (t_ms, ios, errors): {series:?}");
    let first_error = series
        .iter()
        .position(|&(_, _, e)| e > 0)
        .expect("the eio fault produced errors");
    let erring = series.iter().filter(|&&(_, _, e)| e > 0).count();
    assert!(erring >= 3, "errors in {erring} intervals: {series:?}");
    assert!(series[first_error + 1..].len() >= 3, "{series:?}");
    assert!(
        series[first_error..].iter().all(|&(_, ios, _)| ios >= 300),
        "IO must go on at the rate after the first error: {series:?}"
    );
    assert!(series.last().unwrap().0 >= 5500, "{series:?}");
    // About 5% of the ~2,000 IOs of the fault's 4 s, in the totals as in the intervals.
    let per_interval: u64 = series.iter().map(|&(_, _, e)| e).sum();
    let total = volume(&r, "agent-2").total.errors;
    println!("agent-2: {total} errors in total, {per_interval} in the full intervals");
    assert!((40..=200).contains(&total), "{total}");
    assert!(per_interval <= total && per_interval + 30 >= total);
    let cluster: u64 = r.cluster_timeline.iter().map(|p| p.errors).sum();
    assert_eq!(cluster, total, "the cluster's intervals count every error");
    assert_eq!(r.cluster.total.errors, total);
    assert_eq!(volume(&r, "agent-1").total.errors, 0);
    // fio.json: fio's total_err and first_error (EIO) on the failing volume's job; the job's
    // error is the first error, as fio reports a job that went on after errors. fio's format,
    // not the coordinator's model: read as JSON.
    let fio = read_json(&out.join("fio.json"));
    let job = |node: &str| {
        fio["client_stats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["hostname"] == node)
            .unwrap_or_else(|| panic!("no fio job of {node}"))
            .clone()
    };
    let (j2, j1) = (job("agent-2"), job("agent-1"));
    assert_eq!(j2["total_err"], total, "{j2}");
    assert_eq!(j2["first_error"], 5);
    assert_eq!(j2["error"], 5);
    assert_eq!(
        (j1["total_err"].clone(), j1["error"].clone()),
        (0.into(), 0.into())
    );
}

/// Writes that fail with EIO under `continue_on_error=write` are not acknowledged, so the job
/// goes on and its verification at the end stays exact: the failed writes are counted as
/// errors, and no block is reported lost, stale or corrupt for them.
#[test]
fn continue_on_error_on_failed_writes_keeps_verification_exact() {
    let _g = serial();
    let dir = scratch();
    let plan = r#"
name = "coe-verify"
duration = "5s"
[[role]]
name = "db"
rate_iops = 500
[role.workload.fio]
rw = "randwrite"
bs = "4k"
iodepth = 8
size = "4m"
ioengine = "io_uring"
direct = 1
verify = "crc32c"
continue_on_error = "write"
[[fault]]
at = "1s"
duration = "3s"
target = { agents = ["agent-2"] }
kind = "eio"
fraction = 0.05
"#;
    let (o, out) = run_plan(dir.path(), plan, Some(2), &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let r = read_results(&out);
    let errors = volume(&r, "agent-2").write.errors;
    let v = &r
        .verify
        .iter()
        .find(|v| v.node == "agent-2")
        .expect("agent-2 verified")
        .report;
    println!("agent-2: {errors} failed writes; verification {v:?}");
    assert!(errors >= 20, "{errors}");
    assert_eq!(v.good, v.blocks, "{v:?}");
    assert!(v.errors.is_empty(), "{v:?}");
}

/// Unmounts and detaches the loop device when the test ends, pass or fail.
struct LoopMount {
    dev: String,
    mnt: PathBuf,
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn loop_mount(dir: &Path) -> Result<LoopMount, String> {
    let img = dir.join("disk.img");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    let f = std::fs::File::create(&img).map_err(|e| e.to_string())?;
    f.set_len(256 << 20).map_err(|e| e.to_string())?;
    let o = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&img)
        .output()
        .map_err(|e| format!("losetup: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "losetup failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let guard = LoopMount {
        dev: dev.clone(),
        mnt: mnt.clone(),
    };
    let mk = Command::new("mkfs.ext4")
        .args(["-q", &dev])
        .output()
        .map_err(|e| format!("mkfs.ext4: {e}"))?;
    if !mk.status.success() {
        return Err(format!(
            "mkfs.ext4 failed: {}",
            String::from_utf8_lossy(&mk.stderr).trim()
        ));
    }
    let m = Command::new("mount")
        .arg(&dev)
        .arg(&mnt)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if !m.status.success() {
        return Err(format!(
            "mount failed: {}",
            String::from_utf8_lossy(&m.stderr).trim()
        ));
    }
    Ok(guard)
}

/// (f) kernel_throttle: the kernel's own throttle (cgroup v2 io.max or v1 blkio) on a loop
/// device. Needs root, a cgroup io controller, losetup and mkfs.ext4 (`scripts/setup.sh`
/// installs the tools); without them it fails saying what to do (the suite's rule: fail, not
/// skip). A volume on tmpfs is refused with the reason either way.
#[test]
fn kernel_throttle_on_a_loop_device() {
    let _g = serial();
    let dir = scratch();
    let plan = |addr: &str| {
        format!(
            r#"
name = "kernel"
duration = "7s"
[[agent]]
name = "k1"
address = "{addr}"
[[role]]
name = "w"
rate_iops = 1000
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 32
size = "32m"
ioengine = "io_uring"
direct = 1
[[fault]]
at = "2s"
duration = "3s"
target = {{}}
kind = "kernel_throttle"
riops = 200
"#
        )
    };
    // Refused with its reason where it cannot work: a volume on tmpfs (or no privilege).
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let v = tempfile::tempdir_in(shm).unwrap();
        let (_a, addr) = start_agent("k1", v.path(), &[]);
        let d = dir.path().join("refused");
        std::fs::create_dir_all(&d).unwrap();
        let (o, _) = run_plan(&d, &plan(&addr), None, &[]);
        let t = output_text(&o);
        println!(
            "kernel_throttle on tmpfs: {}",
            t.lines()
                .find(|l| l.contains("kernel_throttle"))
                .unwrap_or("")
        );
        assert_eq!(o.status.code(), Some(2), "{t}");
        assert!(
            t.contains("kernel_throttle")
                && (t.contains("not on a block device")
                    || t.contains("needs root")
                    || t.contains("io controller")),
            "{t}"
        );
    }
    if let Err(why) = lockstep_agent::fault::kernel::probe() {
        panic!(
            "kernel_throttle on a loop device cannot run here: {why}. Run the tests as root on a \
             host with cgroup v2's io controller (or a cgroup v1 blkio hierarchy) mounted"
        );
    }
    let mount = loop_mount(dir.path()).unwrap_or_else(|why| {
        panic!(
            "kernel_throttle on a loop device: cannot make one here: {why}. It needs root, \
             losetup (apt-get install mount), mkfs.ext4 (apt-get install e2fsprogs; \
             scripts/setup.sh installs both) and a free loop device (modprobe loop; in a \
             container, run it with --privileged)"
        )
    });
    let (_agent, addr) = start_agent("k1", &mount.mnt, &[]);
    let d = dir.path().join("throttled");
    std::fs::create_dir_all(&d).unwrap();
    let (o, out) = run_plan(&d, &plan(&addr), None, &[]);
    assert!(
        o.status.success() || o.status.code() == Some(1),
        "{}",
        output_text(&o)
    );
    let r = read_results(&out);
    let k = drill(&r, "k1");
    let (k_before, k_during) = (window(&k.baseline, "baseline"), window(&k.during, "during"));
    let series = iops_series(&out, "k1");
    println!(
        "kernel_throttle riops=200 on {}: IOPS per interval {:?}; baseline {:.0}, during {:.0}",
        mount.dev,
        series.iter().map(|s| s.1.round()).collect::<Vec<_>>(),
        k_before.iops,
        k_during.iops
    );
    assert!(k_before.iops > 900.0, "{k:?}");
    // The kernel holds the limit to the IO: whole intervals of the window at ~200 IOPS. (On the
    // test VM, cgroup v1's throttle has now and then let a burst through late in a window
    // while the limit stayed set, so the bound on the window's mean is looser.)
    let inside: Vec<f64> = series
        .iter()
        .filter(|s| s.0 >= 2.0 && s.0 + 1.0 <= 5.0)
        .map(|s| s.1)
        .collect();
    assert!(
        inside.iter().any(|&x| (150.0..=250.0).contains(&x)),
        "no interval at the limit: {series:?}"
    );
    assert!(k_during.iops < 500.0, "{k:?}");
    // The queue built in the kernel shows in the uncorrected latency too (32 / 200 IOPS), in
    // the intervals held at the limit. (Not in the window's p50: when the limit lifts a few ms
    // before the window's last boundary, the open-loop backlog floods through in those ms, and
    // on a fast host its hundreds of quick IOs outnumber the slow ones.)
    let held: Vec<f64> = timeline_points(&out, "k1")
        .iter()
        .filter(|p| {
            let (start, iops) = point_start_and_iops(p);
            start >= 2.0 && start + 1.0 <= 5.0 && (150.0..=250.0).contains(&iops)
        })
        .map(|p| p.lat_p50_us / 1000.0)
        .collect();
    assert!(
        !held.is_empty() && held.iter().all(|&p50| p50 > 50.0),
        "p50 ms of the intervals at the limit: {held:?}; {k:?}"
    );
    drop(_agent);
}

/// Curve mode (vdbench `iorate=curve`): a closed-loop step finds the maximum, then open-loop
/// steps at percentages of it give latency against IOPS.
#[test]
fn rate_curve_finds_the_maximum_then_runs_at_percentages_of_it() {
    let _g = serial();
    let dir = scratch();
    let plan = |extra: &str| {
        format!(
            r#"
name = "curve"
duration = "2s"
[[role]]
name = "db"
rate_curve = [50, 100]
{extra}
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 8
size = "32m"
ioengine = "io_uring"
direct = 1
"#
        )
    };
    let (o, _) = run_plan(
        &mkdir(dir.path().join("bad")),
        &plan("rate_iops = 100"),
        Some(1),
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("give rate_iops or rate_curve, not both"),
        "{}",
        output_text(&o)
    );
    let (o, out) = run_plan(&mkdir(dir.path().join("ok")), &plan(""), Some(1), &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let r = read_results(&out);
    let series = r.series.as_ref().expect("a curve's figures");
    let c = &series.curve.as_ref().expect("a curve section").roles[0];
    let steps = &c.steps;
    assert_eq!(
        steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["max", "50%", "100%"]
    );
    let max = c.max_iops_per_volume;
    println!("curve: maximum {max:.0} IOPS (closed loop, iodepth 8)");
    for s in &steps[1..] {
        let target = s.target_iops.expect("an open-loop step's target") as f64;
        let achieved = s.role.iops;
        println!(
            "curve step {}: target {target:.0} IOPS, achieved {achieved:.0}, p99 {:.2} ms",
            s.name,
            ms(s.role.p99_ns)
        );
        assert!(
            (target - max * s.percent.expect("a step's percentage") / 100.0).abs() <= 1.0,
            "{s:?}"
        );
        assert!(s.role.intended);
        assert!(out.join(&s.dir).join("results.json").is_file());
    }
    let half = &steps[1].role;
    let target = steps[1].target_iops.expect("the 50% step's target") as f64;
    assert!(
        (half.iops - target).abs() / target < 0.05,
        "the 50% step must hold its rate: {half:?}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("rate curve, role db"));
}

/// The directory, created.
fn mkdir(p: PathBuf) -> PathBuf {
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A verifying job on a volume that is one file verifies what it wrote, and nothing appears
/// beside the file: the agent may write the volume and nothing else (docs/safety.md), so the
/// state that `lockstep-agent verify` reads after a restart is not saved there.
#[test]
fn a_verifying_job_on_a_file_volume_writes_nothing_beside_it() {
    let _g = serial();
    let dir = scratch();
    let home = dir.path().join("volumes");
    std::fs::create_dir_all(&home).unwrap();
    let file = home.join("vol.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let (_agent, addr) = start_agent("a1", &file, &[]);
    let plan = format!(
        r#"
name = "verify-file"
duration = "3s"
[[agent]]
name = "a1"
address = "{addr}"
[[role]]
name = "w"
rate_iops = 1000
[role.workload.fio]
rw = "randwrite"
bs = "4k"
iodepth = 8
size = "8m"
ioengine = "io_uring"
direct = 1
verify = "crc32c"
"#
    );
    let out_dir = dir.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let (o, out) = run_plan(&out_dir, &plan, None, &[]);
    assert!(o.status.success(), "{}", output_text(&o));
    let r = read_results(&out);
    let v = &r.verify[0].report;
    assert!(v.blocks > 0 && v.good == v.blocks, "{v:?}");
    assert!(v.errors.is_empty(), "{v:?}");
    let beside: Vec<String> = std::fs::read_dir(&home)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        beside,
        vec!["vol.img".to_string()],
        "written beside the volume"
    );
}
