//! Long-run benchmark of the coordinator's data path (not a test): a run of many intervals
//! through the merge, the kept timeline and the data files, as `Streams::on_interval` does it,
//! without sockets (the simulator, `lockstep-agent simulate`, measures the network path).
//!
//! `cargo run --release -p lockstep --example long_run -- [--agents 100] [--volumes 8]
//!  [--intervals 43200] [--ios 2000] [--digits 3|2] [--out DIR] [--discard-histograms]`
//!
//! `--ios`: IOs per direction per volume-interval (the histograms' size follows it).
//! `--digits 2`: histograms coarsened to 2 significant digits (`histogram_digits = 2`).
//! `--discard-histograms`: frees the histograms' disk blocks as they are written (a hole
//! punched in `histograms.lsh` every minute of the run, its size kept), so a run whose data
//! files would not fit this disk (12 hours of 1,000 x 8: 220 GB) still measures memory, the
//! end of the run and `lockstep report`; the bytes stored are then the writer's count.
//!
//! Prints RSS every 10% of the run (it must stay flat after the first minute), the merge time
//! per interval, the bytes on disk per volume-hour, and the time `lockstep report` takes on the
//! results directory it leaves.

#[path = "support/histograms.rs"]
mod support;

use std::time::Instant;

use lockstep::results::merge::{Merger, PlannedVolume};
use lockstep::results::store::{self, Manifest, StoreWriter, StoredVolume};
use lockstep::results::{RunResults, RunStatus};

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    // Allocated blocks, not the apparent size (points.bin may be sparse).
                    use std::os::unix::fs::MetadataExt;
                    e.metadata().map_or(0, |m| m.blocks() * 512)
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Frees the disk blocks of what `path` holds so far, keeping its size (the writer goes on
/// appending after it).
fn punch_written(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    // The first block (the magic) stays.
    let end = f.metadata().unwrap().len() & !4095;
    if end <= 4096 {
        return;
    }
    // SAFETY: fallocate on an open descriptor; it only frees blocks within the file.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            (end - 4096) as libc::off_t,
        )
    };
    assert_eq!(
        r,
        0,
        "punching {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn main() {
    let agents: usize = arg("--agents", 100);
    let volumes: usize = arg("--volumes", 8);
    let intervals: u64 = arg("--intervals", 43_200);
    let out: String = arg("--out", String::new());
    let ios: u64 = arg("--ios", 2000);
    let digits: u8 = arg("--digits", 3);
    let discard = std::env::args().any(|a| a == "--discard-histograms");
    assert!(matches!(digits, 2 | 3), "--digits 2 or 3");
    let tmp = tempfile::tempdir().unwrap();
    let out = if out.is_empty() {
        tmp.path().to_path_buf()
    } else {
        std::path::PathBuf::from(out)
    };
    std::fs::create_dir_all(&out).unwrap();
    let pool = support::volume_intervals(256, 11, ios, digits);
    let infos: Vec<PlannedVolume> = (0..agents)
        .flat_map(|a| {
            (0..volumes).map(move |v| PlannedVolume {
                node: format!("agent-{a}"),
                volume: format!("data{}", v + 1),
                role: "worker".into(),
                model: None,
                target_iops: None,
            })
        })
        .collect();
    let names: Vec<String> = (0..agents).map(|a| format!("agent-{a}")).collect();
    let vol_names: Vec<String> = (0..volumes).map(|v| format!("data{}", v + 1)).collect();
    let mut merger = Merger::new(1000, &infos)
        .planned_intervals(intervals)
        .points_on_disk();
    let manifest = Manifest::new(
        1000,
        infos
            .iter()
            .map(|v| StoredVolume {
                node: v.node.clone(),
                volume: v.volume.clone(),
                role: v.role.clone(),
            })
            .collect(),
    );
    let data_dir = out.join(store::DATA_DIR);
    let writer = StoreWriter::create(&data_dir, &manifest).unwrap();
    println!(
        "long run: {agents} agents x {volumes} volumes x {intervals} intervals; timeline kept at 1 point per {} intervals, {} recent",
        merger.keep().fold,
        merger.keep().recent
    );
    println!(
        "  {:>9} {:>9} {:>10} {:>12}",
        "interval", "RSS MiB", "elapsed s", "ms/interval"
    );
    let started = Instant::now();
    // The benchmark's own timing in bounded memory (a Vec of every interval's time had been
    // 0.35 MiB of the growth it measures over 43,200 intervals).
    let mut per_interval =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    let mut last_minute = std::collections::VecDeque::with_capacity(60);
    let mut k = 0usize;
    let mut rss = Vec::new();
    for i in 0..intervals {
        let t = Instant::now();
        for (a, name) in names.iter().enumerate() {
            let first = (a * volumes) as u32;
            let vis: Vec<_> = vol_names
                .iter()
                .map(|vname| {
                    let mut vi = pool[k % pool.len()].clone();
                    k += 1;
                    vi.volume.clone_from(vname);
                    vi
                })
                .collect();
            let records = vis.iter().map(store::records_len).sum();
            let mut block = writer.block(i, 1000, first, volumes as u32, records);
            for (v, vi) in vis.iter().enumerate() {
                let p = merger.ingest(name, i, 1000, vi, true).expect("merge");
                let id = first + v as u32;
                block.add_point(id, &store::format::encode_point(&p, true));
                block.add(id, vi);
            }
            writer.write(block);
        }
        if discard && (i + 1) % 60 == 0 {
            punch_written(&data_dir.join(store::HISTOGRAMS));
        }
        let took = t.elapsed();
        per_interval.saturating_record(took.as_micros() as u64);
        if last_minute.len() == 60 {
            last_minute.pop_front();
        }
        last_minute.push_back(took.as_secs_f64());
        if (i + 1) % (intervals / 10).max(1) == 0 || i == 59 {
            let r = support::rss_mib();
            rss.push((i + 1, r));
            println!(
                "  {:>9} {:>9.0} {:>10.1} {:>12.1}",
                i + 1,
                r,
                started.elapsed().as_secs_f64(),
                last_minute.iter().sum::<f64>() / last_minute.len() as f64 * 1000.0
            );
        }
    }
    let stats = writer.finish();
    let fin = merger.finish(intervals as f64).unwrap();
    let t = Instant::now();
    let timeline = store::StoreReader::open(&out)
        .and_then(|r| r.timeline(&merger.keep(), merger.timeline()))
        .unwrap();
    let read_back_s = t.elapsed().as_secs_f64();
    let rss_end = support::rss_mib();
    let results = RunResults {
        lockstep_version: "bench".into(),
        run_id: "long-run".into(),
        plan: "long-run".into(),
        status: RunStatus::Completed,
        status_reason: String::new(),
        start_unix_ms: 0,
        duration_ms: intervals * 1000,
        interval_ms: 1000,
        phases: vec![],
        agents: vec![],
        start_skew_ns: None,
        cluster: fin.cluster,
        nodes: fin.nodes,
        volumes: fin.volumes,
        cluster_timeline: fin.cluster_timeline,
        timeline,
        finals: Vec::new(),
        objectives: vec![],
        chokepoint: None,
        faults: vec![],
        warnings: vec![],
        drill: None,
        stuck_ios: Vec::new(),
        verify: Vec::new(),
        series: None,
        data: None,
        mirror: None,
    };
    lockstep::export::write_run_dir(&out, &results, &lockstep::export::RUN_DIR).unwrap();
    let peak = rss.iter().map(|r| r.1).fold(0.0, f64::max);
    let after_minute = rss.iter().find(|r| r.0 >= 60).map_or(0.0, |r| r.1);
    let volume_hours = (agents * volumes) as f64 * intervals as f64 / 3600.0;
    let data = if discard {
        punch_written(&data_dir.join(store::HISTOGRAMS));
        let discarded = dir_bytes(&data_dir);
        println!(
            "  histograms discarded as written: data/ holds {:.2} GB; below, their size as stored",
            discarded as f64 / 1e9
        );
        discarded + stats.stored_bytes
    } else {
        dir_bytes(&data_dir)
    };
    println!(
        "  merge+store per interval: median {:.1} ms, worst {:.1} ms",
        per_interval.value_at_quantile(0.5) as f64 / 1000.0,
        per_interval.max() as f64 / 1000.0
    );
    println!(
        "  RSS after the first minute {after_minute:.0} MiB, peak {peak:.0} MiB ({:+.1}%)",
        (peak / after_minute.max(1.0) - 1.0) * 100.0
    );
    println!(
        "  data/: {:.2} GB = {:.2} MB per volume-hour (histograms {:.0} B per volume-interval as sent, {:.0} B stored)",
        data as f64 / 1e9,
        data as f64 / 1e6 / volume_hours,
        stats.raw_bytes as f64 / (agents * volumes) as f64 / intervals as f64,
        stats.stored_bytes as f64 / (agents * volumes) as f64 / intervals as f64
    );
    println!(
        "  timeline read back from data/points.bin: {read_back_s:.1} s, {} points per volume; RSS then {rss_end:.0} MiB",
        results
            .timeline
            .volumes
            .first()
            .map_or(0, |v| v.points.len())
    );
    for f in ["results.json", "timeline.json", "report.html"] {
        let m = std::fs::metadata(out.join(f)).map_or(0, |m| m.len());
        println!("  {f}: {:.1} MB", m as f64 / 1e6);
    }
    let exe = std::env::current_exe().unwrap();
    let lockstep = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("lockstep"))
        .filter(|p| p.exists());
    match lockstep {
        Some(bin) => {
            let t = Instant::now();
            let o = std::process::Command::new(&bin)
                .arg("report")
                .arg(&out)
                .output()
                .unwrap();
            println!(
                "  lockstep report: {:.2} s ({} lines, exit {})",
                t.elapsed().as_secs_f64(),
                String::from_utf8_lossy(&o.stdout).lines().count(),
                o.status
            );
        }
        None => println!(
            "  lockstep report: build the binary first (cargo build --release -p lockstep)"
        ),
    }
}
