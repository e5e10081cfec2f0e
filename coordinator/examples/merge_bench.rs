//! Benchmark of the coordinator's merge path with simulated agents (not a test).
//!
//! `cargo run --release -p lockstep --example merge_bench -- [--agents 1000] [--volumes 8]
//! [--intervals 60] [--wire stored|plain|deflate] [--digits 3|2] [--per-volume] [--skip-report]`
//!
//! Each simulated agent sends, every interval, one `IntervalReport` with all its volumes, each
//! with read and write latency histograms (~2,000 IOs each from a lognormal around 0.5 ms, in
//! the `--wire` framing), as prost-encoded bytes: the path measured is prost decode -> merge,
//! everything the coordinator does with a report short of the socket and the hlog. The merge
//! runs on one thread (the coordinator's merge loop is one task), so "keeps up on one core"
//! means the CPU time to handle one interval of every volume is below the interval. It prints,
//! per interval, the median and worst wall and thread CPU time, the CPU per volume-interval
//! (prost decode and merge apart), the bytes per volume-interval on the wire, peak memory, the
//! time to finish (volume, node, cluster results), and the time for `lockstep report` to load
//! results.json and render the text report of a run of this size. First it compares the three
//! wire framings on the same histograms: bytes, the agent's encode and the coordinator's decode.
//! `--per-volume` merges with `Merger::ingest`, one call per volume (the path of
//! orchestrate/streams.rs today), instead of `Merger::ingest_report`. `--digits 2` sends the
//! histograms coarsened to 2 significant digits, as agents do under `histogram_digits = 2`.

use std::time::Instant;

use hdrhistogram::Histogram;
use lockstep::results::merge::{Merger, PlannedVolume};
use lockstep::results::{RunResults, RunStatus};
use lockstep_proto::histogram::{BucketDecoder, WIRE, Wire, coarsen, encode_as};
use lockstep_proto::v1::{DirInterval, IntervalReport, VolumeInterval};
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

fn args() -> Vec<String> {
    std::env::args().collect()
}

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args = args();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn flag(name: &str) -> bool {
    args().iter().any(|a| a == name)
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

/// This thread's CPU time in seconds: on a shared machine, wall time also counts the time
/// other processes held the core.
fn cpu_s() -> f64 {
    // SAFETY: clock_gettime fills the struct we pass.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

const POOL: usize = 64;

/// `POOL` x [read, write] interval histograms of one volume.
fn histograms(seed: u64) -> Vec<[Histogram<u64>; 2]> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let lat = LogNormal::new((500_000f64).ln(), 0.6).unwrap();
    let mut one = || {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        let n = 1500 + rng.random_range(0..1000);
        for _ in 0..n {
            h.record((lat.sample(&mut rng) as u64).max(1)).unwrap();
        }
        h
    };
    (0..POOL).map(|_| [one(), one()]).collect()
}

fn dir(h: &Histogram<u64>, wire: Wire) -> DirInterval {
    DirInterval {
        ios: h.len(),
        bytes: h.len() * 8192,
        errors: 0,
        clat_hist: Vec::new(),
        lat_hist: encode_as(h, wire).unwrap(),
        lat_intended_hist: Vec::new(),
    }
}

/// `POOL` prost-encoded reports of `volumes` volumes each, as an agent sends them.
fn reports(hists: &[[Histogram<u64>; 2]], volumes: usize, wire: Wire) -> Vec<Vec<u8>> {
    (0..POOL)
        .map(|r| {
            IntervalReport {
                index: 0,
                end_agent_ns: 0,
                len_ns: 1_000_000_000,
                volumes: (0..volumes)
                    .map(|v| {
                        let [rd, wr] = &hists[(r * volumes + v) % hists.len()];
                        VolumeInterval {
                            volume: format!("vol{v}"),
                            read: Some(dir(rd, wire)),
                            write: Some(dir(wr, wire)),
                            outstanding: 8.0,
                            configured_depth: 8,
                            active_faults: vec![],
                        }
                    })
                    .collect(),
            }
            .encode_to_vec()
        })
        .collect()
}

/// Bytes, agent encode and coordinator decode per histogram, for each framing.
fn compare_wires(hists: &[[Histogram<u64>; 2]]) {
    println!(
        "wire framings on the same {} histograms (per histogram):",
        hists.len() * 2
    );
    let all: Vec<&Histogram<u64>> = hists.iter().flatten().collect();
    for wire in [Wire::Deflate, Wire::Stored, Wire::Plain] {
        let reps = 20;
        let t = cpu_s();
        let mut encoded = Vec::new();
        for _ in 0..reps {
            encoded = all.iter().map(|h| encode_as(h, wire).unwrap()).collect();
        }
        let enc_us = (cpu_s() - t) * 1e6 / (reps * all.len()) as f64;
        let mut dec = BucketDecoder::default();
        let mut out = Vec::new();
        let t = cpu_s();
        for _ in 0..reps {
            for b in &encoded {
                dec.decode(b, &mut out).unwrap();
            }
        }
        let dec_us = (cpu_s() - t) * 1e6 / (reps * all.len()) as f64;
        let bytes = encoded.iter().map(Vec::len).sum::<usize>() as f64 / encoded.len() as f64;
        println!(
            "  {:<8} {bytes:>6.0} bytes   agent encode {enc_us:>6.2} us   coordinator decode {dec_us:>6.2} us",
            format!("{wire:?}").to_lowercase()
        );
    }
}

fn planned(agents: usize, volumes: usize) -> Vec<PlannedVolume> {
    (0..agents)
        .flat_map(|a| {
            (0..volumes).map(move |v| PlannedVolume {
                node: format!("agent-{a}"),
                volume: format!("vol{v}"),
                role: "worker".into(),
                model: None,
                target_iops: None,
            })
        })
        .collect()
}

/// Per interval: (wall s, cpu s), plus the CPU seconds spent in prost decode over the run.
struct Timing {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    prost_cpu: f64,
}

fn run(merger: &mut Merger, pool: &[Vec<u8>], agents: usize, intervals: usize) -> Timing {
    let names: Vec<String> = (0..agents).map(|a| format!("agent-{a}")).collect();
    let per_volume = flag("--per-volume");
    let mut timing = Timing {
        wall: Vec::new(),
        cpu: Vec::new(),
        prost_cpu: 0.0,
    };
    for i in 0..intervals as u64 {
        let (t, c) = (Instant::now(), cpu_s());
        for (a, name) in names.iter().enumerate() {
            let bytes = &pool[(a + i as usize * 7) % pool.len()];
            let c0 = cpu_s();
            let mut report = IntervalReport::decode(&bytes[..]).expect("prost decode");
            timing.prost_cpu += cpu_s() - c0;
            report.index = i;
            if per_volume {
                for v in &report.volumes {
                    merger.ingest(name, i, 1000, v, true).expect("merge");
                }
            } else {
                for r in merger.ingest_report(name, &report, true) {
                    r.expect("merge");
                }
            }
        }
        timing.wall.push(t.elapsed().as_secs_f64());
        timing.cpu.push(cpu_s() - c);
    }
    timing
}

fn median_worst(v: &[f64]) -> (f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    let agents = arg("--agents", 1000usize);
    let volumes = arg("--volumes", 8usize);
    let intervals = arg("--intervals", 60usize);
    let wire: Wire = arg("--wire", WIRE);
    let digits: u8 = arg("--digits", 3);
    let hists: Vec<[Histogram<u64>; 2]> = histograms(7)
        .iter()
        .map(|pair| {
            pair.each_ref()
                .map(|h| coarsen(h, digits).expect("--digits 2 or 3"))
        })
        .collect();
    compare_wires(&hists);
    let pool = reports(&hists, volumes, wire);
    let wire_bytes = pool.iter().map(Vec::len).sum::<usize>() as f64 / (POOL * volumes) as f64;

    let mut merger = Merger::new(1000, &planned(agents, volumes));
    let t_all = cpu_s();
    let timing = run(&mut merger, &pool, agents, intervals);
    let merge_cpu = cpu_s() - t_all;
    let (t, c) = (Instant::now(), cpu_s());
    let fin = merger.finish(intervals as f64).unwrap();
    let (finish_s, finish_cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    let rss_after_merge = peak_rss_mib();

    let n = (agents * volumes) as f64;
    let (wall_med, wall_worst) = median_worst(&timing.wall);
    let (cpu_med, cpu_worst) = median_worst(&timing.cpu);
    println!(
        "merge path: {agents} agents x {volumes} volumes, {intervals} intervals of 1 s, one thread, wire {wire:?}, {digits} significant digits{}",
        if flag("--per-volume") {
            ", Merger::ingest per volume"
        } else {
            ", Merger::ingest_report per agent"
        }
    );
    println!("  wire bytes per volume-interval (prost IntervalReport / volumes): {wire_bytes:.0}");
    println!(
        "  per interval: wall median {wall_med:.3} s, worst {wall_worst:.3} s; CPU median {cpu_med:.3} s, worst {cpu_worst:.3} s (budget 1 s; goal 0.5 s at 10,000 x 8)"
    );
    println!(
        "  CPU per volume-interval: {:.2} us (prost decode {:.2} us, merge {:.2} us)",
        merge_cpu * 1e6 / (n * intervals as f64),
        timing.prost_cpu * 1e6 / (n * intervals as f64),
        (merge_cpu - timing.prost_cpu) * 1e6 / (n * intervals as f64),
    );
    println!(
        "  finish (volume, node, cluster summaries): wall {finish_s:.3} s, CPU {finish_cpu:.3} s"
    );
    println!("  peak memory after merging: {rss_after_merge:.0} MiB");
    live_finder(&merger);
    if !flag("--skip-report") {
        report_times(&merger, fin, intervals);
    }
}

/// What the live view's chokepoint finder costs the run loop each time it looks: copying the
/// recent window out of the merger, then the analysis (app/live.rs).
fn live_finder(merger: &Merger) {
    use lockstep::analysis::chokepoint::{AnalysisOptions, analyze};
    let c = cpu_s();
    let window = merger.recent_timeline();
    let copy = cpu_s() - c;
    let c = cpu_s();
    let report = analyze(&window, &AnalysisOptions::default());
    let analysis = cpu_s() - c;
    let points = window.volumes.first().map_or(0, |v| v.points.len());
    println!(
        "  live finder on the recent window ({points} intervals a volume): copy {copy:.3} s, analysis {analysis:.3} s of CPU ({} volumes scored)",
        report.volumes.len()
    );
}

/// A results directory of this size, then `lockstep report` on it.
fn report_times(merger: &Merger, fin: lockstep::results::merge::Finished, intervals: usize) {
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
        mirror: None,
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
    println!(
        "  writing the results directory: {write_s:.2} s; results.json {:.1} MiB",
        size as f64 / 1048576.0
    );
    println!(
        "  lockstep report (load results.json + render {} lines): {report_s:.3} s (budget 2 s)",
        text.lines().count()
    );
}
