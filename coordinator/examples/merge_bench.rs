//! Benchmark of the coordinator's merge path with simulated agents (not a test).
//!
//! `cargo run --release -p lockstep --example merge_bench -- [--agents 1000] [--volumes 8] [--intervals 60]`
//!
//! Each simulated agent sends, every interval, one report per volume with read and write
//! latency histograms (HdrHistogram V2+deflate, as agents send them, ~2,000 IOs each from a
//! lognormal around 0.5 ms). The merge runs on one thread (the coordinator's merge loop is one
//! task), so "keeps up at 1 s intervals on one core" means: the time to merge one interval of
//! every volume is below 1 s. It prints that time per interval (median and worst), the merge
//! rate, peak memory, the time to finish (volume, node, cluster results), and the time for
//! `lockstep report` to load results.json and render the text report of a run of this size.

use std::time::Instant;

use hdrhistogram::Histogram;
use lockstep::results::merge::{Merger, PlannedVolume};
use lockstep::results::{RunResults, RunStatus};
use lockstep_proto::histogram::encode;
use lockstep_proto::v1::{DirInterval, VolumeInterval};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_rss_mib() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    ru.ru_maxrss as f64 / 1024.0
}

fn main() {
    let agents = arg("--agents", 1000);
    let volumes = arg("--volumes", 8);
    let intervals = arg("--intervals", 60);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
    let lat = LogNormal::new((500_000f64).ln(), 0.6).unwrap();
    // 64 distinct interval reports, reused round robin (decoding cost does not depend on reuse).
    let variants: Vec<VolumeInterval> = (0..64)
        .map(|_| {
            let mut dir = || {
                let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
                let n = 1500 + rng.random_range(0..1000);
                for _ in 0..n {
                    h.record((lat.sample(&mut rng) as u64).max(1)).unwrap();
                }
                DirInterval {
                    ios: n,
                    bytes: n * 8192,
                    errors: 0,
                    clat_hist: Vec::new(),
                    lat_hist: encode(&h).unwrap(),
                    lat_intended_hist: Vec::new(),
                }
            };
            VolumeInterval {
                volume: String::new(),
                read: Some(dir()),
                write: Some(dir()),
                outstanding: 8.0,
                configured_depth: 8,
                active_faults: vec![],
            }
        })
        .collect();
    let wire_bytes: usize = variants
        .iter()
        .map(|v| v.read.as_ref().unwrap().lat_hist.len() * 2)
        .sum::<usize>()
        / 64;
    let infos: Vec<PlannedVolume> = (0..agents)
        .flat_map(|a| {
            (0..volumes).map(move |v| PlannedVolume {
                node: format!("agent-{a}"),
                volume: format!("vol{v}"),
                role: "worker".into(),
                model: None,
                target_iops: None,
            })
        })
        .collect();
    let names: Vec<String> = (0..agents).map(|a| format!("agent-{a}")).collect();
    let mut merger = Merger::new(1000, &infos);
    let mut per_interval = Vec::with_capacity(intervals);
    let t_all = Instant::now();
    let mut k = 0usize;
    for i in 0..intervals as u64 {
        let t = Instant::now();
        for name in &names {
            for v in 0..volumes {
                let mut vi = variants[k % variants.len()].clone();
                k += 1;
                vi.volume = format!("vol{v}");
                merger.ingest(name, i, 1000, &vi, true).expect("merge");
            }
        }
        per_interval.push(t.elapsed().as_secs_f64());
    }
    let merge_total = t_all.elapsed().as_secs_f64();
    per_interval.sort_by(f64::total_cmp);
    let t = Instant::now();
    let fin = merger.finish(intervals as f64).unwrap();
    let finish_s = t.elapsed().as_secs_f64();
    let rss_after_merge = peak_rss_mib();

    // A results directory of this size, then `lockstep report` on it.
    let results = RunResults {
        lockstep_version: "bench".into(),
        run_id: "bench".into(),
        plan: "bench".into(),
        status: RunStatus::Completed,
        status_reason: String::new(),
        start_unix_ms: 0,
        duration_ms: intervals as u64 * 1000,
        interval_ms: 1000,
        phases: vec![],
        agents: vec![],
        start_skew_ns: None,
        cluster: fin.cluster,
        nodes: fin.nodes,
        volumes: fin.volumes,
        cluster_timeline: fin.cluster_timeline,
        timeline: merger.timeline(),
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
    };
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    lockstep::export::write_run_dir(dir.path(), &results, &lockstep::export::RUN_DIR).unwrap();
    let write_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let loaded = lockstep::export::read_run_dir(dir.path()).unwrap();
    let text = lockstep::export::text::render(&loaded);
    let report_s = t.elapsed().as_secs_f64();
    let size = std::fs::metadata(dir.path().join("results.json"))
        .unwrap()
        .len();

    let n = (agents * volumes) as f64;
    println!(
        "merge path: {agents} agents x {volumes} volumes, {intervals} intervals of 1 s, one thread"
    );
    println!("  wire size of one volume interval (2 histograms): {wire_bytes} bytes");
    println!(
        "  merge time per interval: median {:.3} s, worst {:.3} s (budget 1 s) -> {:.0} volume-intervals/s",
        per_interval[per_interval.len() / 2],
        per_interval[per_interval.len() - 1],
        n * intervals as f64 / merge_total
    );
    println!("  finish (volume, node, cluster summaries): {finish_s:.3} s");
    println!("  peak memory after merging: {rss_after_merge:.0} MiB");
    println!(
        "  writing the results directory: {write_s:.2} s; results.json {:.1} MiB",
        size as f64 / 1048576.0
    );
    println!(
        "  lockstep report (load results.json + render {} lines): {report_s:.3} s (budget 2 s)",
        text.lines().count()
    );
}
