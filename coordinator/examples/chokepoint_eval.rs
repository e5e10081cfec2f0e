//! Evaluates the chokepoint finder on labeled scenarios and times it at cluster scale.
//!
//! ```text
//! cargo run --release -p lockstep --example chokepoint_eval -- [--seed N] [--scenarios N]
//!     [--no-timing] [--verbose] [--nodes N --volumes N --intervals N] [--only I]
//! ```
//!
//! Prints precision and recall of naming the right volume, single-volume blames on scenarios
//! where there is no single culprit, node / cluster-wide / load-generator verdicts, the onset
//! error in intervals, the kind accuracy, the credit forecast error, and the time and memory of
//! one analysis of a 1,000 nodes x 8 volumes x 3,600 intervals run. Exits 1 when a target of
//! issue 6 is missed (precision and recall >= 0.95, no false single-volume blame, onset within
//! 2 intervals for at least 99% of the right verdicts, analysis under 10 s); the scenarios that
//! miss are listed, and `--only I` shows one of them in detail.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use lockstep::analysis::chokepoint::{
    AnalysisOptions, ChokepointReport, Verdict, analyze, render_text,
};
use lockstep::scenario::{
    self, Expected, LoadMode, Scenario, ScenarioKind, ScenarioRng, ScenarioSpec,
};

struct Args {
    seed: u64,
    scenarios: usize,
    timing: bool,
    verbose: bool,
    nodes: usize,
    volumes: usize,
    intervals: usize,
    only: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seed: 1,
        scenarios: 360,
        timing: true,
        verbose: false,
        nodes: 1000,
        volumes: 8,
        intervals: 3600,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--seed" => a.seed = num("--seed")?,
            "--scenarios" => a.scenarios = num("--scenarios")? as usize,
            "--nodes" => a.nodes = num("--nodes")? as usize,
            "--volumes" => a.volumes = num("--volumes")? as usize,
            "--intervals" => a.intervals = num("--intervals")? as usize,
            "--only" => a.only = Some(num("--only")? as usize),
            "--no-timing" => a.timing = false,
            "--verbose" => a.verbose = true,
            "-h" | "--help" => {
                return Err("usage: chokepoint_eval [--seed N] [--scenarios N] [--no-timing] [--verbose] [--nodes N --volumes N --intervals N] [--only I]\n  --only I: analyze scenario I of the suite alone and show its report and the culprit's intervals around the onset".into());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(a)
}

fn describe(v: &Verdict) -> String {
    match v {
        Verdict::None => "none".into(),
        Verdict::Volume(v) => format!(
            "volume {}:{} {} @{}",
            v.node,
            v.volume,
            v.kind.as_str(),
            v.onset_interval
        ),
        Verdict::Node(n) => format!("node {} @{}", n.node, n.onset_interval),
        Verdict::ClusterWide(c) => format!(
            "cluster-wide @{} ({:.1}x)",
            c.onset_interval, c.latency_factor
        ),
        Verdict::LoadGeneratorBound(lg) => format!(
            "load generator ({:.0}% depth)",
            lg.outstanding_ratio * 100.0
        ),
    }
}

fn describe_expected(e: &Expected, onset: Option<usize>) -> String {
    let at = onset.map(|o| format!(" @{o}")).unwrap_or_default();
    match e {
        Expected::None => "none".into(),
        Expected::Volume { node, volume, kind } => {
            format!("volume {node}:{volume} {}{at}", kind.as_str())
        }
        Expected::Node { node } => format!("node {node}{at}"),
        Expected::ClusterWide => format!("cluster-wide{at}"),
        Expected::LoadGeneratorBound => "load generator".into(),
    }
}

#[derive(Default)]
struct Tally {
    n: usize,
    right: usize,
}

fn rss_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let base = AnalysisOptions::default();
    if let Some(i) = args.only {
        show_one(args.seed, i, &base);
        return ExitCode::SUCCESS;
    }
    println!(
        "chokepoint_eval: seed {}, {} scenarios ({} kinds in turn, closed- and open-loop alternating)",
        args.seed,
        args.scenarios,
        ScenarioKind::ALL.len()
    );

    let (mut tp, mut fp, mut expected_volumes) = (0usize, 0usize, 0usize);
    let mut false_blames = 0usize;
    let mut no_culprit = 0usize;
    let mut onset_errors: Vec<usize> = Vec::new();
    let (mut kind_right, mut kind_confusion) = (0usize, BTreeMap::<(String, String), usize>::new());
    let mut forecast_errors: Vec<f64> = Vec::new();
    let mut early_forecast_errors: Vec<f64> = Vec::new();
    let mut per_kind: BTreeMap<(&str, &str), Tally> = BTreeMap::new();
    let mut misses: Vec<String> = Vec::new();
    let mut analysis_secs = 0.0;
    let mut points = 0usize;

    for (i, sc) in scenario::suite(args.seed, args.scenarios).enumerate() {
        let opts = sc.options(&base);
        let start = Instant::now();
        let r = analyze(&sc.timeline, &opts);
        analysis_secs += start.elapsed().as_secs_f64();
        points += sc
            .timeline
            .volumes
            .iter()
            .map(|s| s.points.len())
            .sum::<usize>();
        let label = &sc.label;
        let mode = match sc.spec.mode {
            LoadMode::ClosedLoop => "closed",
            LoadMode::OpenLoop => "open",
        };
        let right = match (&label.expected, &r.verdict) {
            (Expected::None, Verdict::None) => true,
            (Expected::Volume { node, volume, .. }, Verdict::Volume(v)) => {
                &v.node == node && &v.volume == volume
            }
            (Expected::Node { node }, Verdict::Node(n)) => &n.node == node,
            (Expected::ClusterWide, Verdict::ClusterWide(_)) => true,
            (Expected::LoadGeneratorBound, Verdict::LoadGeneratorBound(_)) => true,
            _ => false,
        };
        let t = per_kind.entry((sc.spec.kind.name(), mode)).or_default();
        t.n += 1;
        t.right += right as usize;

        // Naming the right volume.
        let is_volume_scenario = matches!(label.expected, Expected::Volume { .. });
        expected_volumes += is_volume_scenario as usize;
        if let Verdict::Volume(_) = &r.verdict {
            if right { tp += 1 } else { fp += 1 }
        }
        let single_culprit_free = matches!(
            sc.spec.kind,
            ScenarioKind::Clean
                | ScenarioKind::HarmlessBursts
                | ScenarioKind::ClusterWide
                | ScenarioKind::LoadGeneratorBound
        );
        if single_culprit_free {
            no_culprit += 1;
            // Stricter than the verdict alone: no volume among the weaker findings either.
            if std::iter::once(&r.verdict)
                .chain(&r.also)
                .any(|v| matches!(v, Verdict::Volume(_)))
            {
                false_blames += 1;
            }
        }

        // Onset and kind of right verdicts.
        let got_onset = match &r.verdict {
            Verdict::Volume(v) => Some(v.onset_interval),
            Verdict::Node(n) => Some(n.onset_interval),
            Verdict::ClusterWide(c) => Some(c.onset_interval),
            _ => None,
        };
        if let (true, Some(want), Some(got)) = (right, label.onset_interval, got_onset) {
            onset_errors.push(want.abs_diff(got));
            if want.abs_diff(got) > 2 {
                misses.push(format!(
                    "#{i} {} {mode}: onset {got}, labeled {want}",
                    sc.spec.kind.name()
                ));
            }
        }
        if let (true, Expected::Volume { kind, .. }, Verdict::Volume(v)) =
            (right, &label.expected, &r.verdict)
        {
            if *kind == v.kind {
                kind_right += 1;
            } else {
                *kind_confusion
                    .entry((kind.as_str().to_string(), v.kind.as_str().to_string()))
                    .or_default() += 1;
                misses.push(format!(
                    "#{i} {} {mode}: kind {}, labeled {}",
                    sc.spec.kind.name(),
                    v.kind.as_str(),
                    kind.as_str()
                ));
            }
            if let (Some(c), Some(onset_ms)) = (&v.evidence.credit, label.onset_ms) {
                if let Some(f) = c.forecast_onset_ms {
                    forecast_errors
                        .push((f as f64 - onset_ms as f64).abs() / onset_ms.max(1) as f64);
                }
                if let Some(e) = early_forecast(&sc, &opts, onset_ms) {
                    early_forecast_errors.push(e);
                }
            }
        }
        if !right {
            misses.push(format!(
                "#{i} {} {mode} {}x{} r{} n{} sev {:.3}: expected {}, got {}",
                sc.spec.kind.name(),
                sc.spec.nodes,
                sc.spec.volumes_per_node,
                sc.spec.roles,
                sc.spec.intervals,
                label.severity,
                describe_expected(&label.expected, label.onset_interval),
                describe(&r.verdict)
            ));
            if args.verbose {
                print!("{}", render_text(&r));
            }
        }
    }

    println!("\n{:<18} {:>6} {:>4} {:>6}", "kind", "mode", "n", "right");
    for ((kind, mode), t) in &per_kind {
        println!("{kind:<18} {mode:>6} {:>4} {:>6}", t.n, t.right);
    }
    let precision = tp as f64 / (tp + fp).max(1) as f64;
    let recall = tp as f64 / expected_volumes.max(1) as f64;
    println!(
        "\nnaming the right volume: precision {precision:.3} ({tp} right, {fp} wrong blames), recall {recall:.3} ({tp} of {expected_volumes})"
    );
    println!(
        "single-volume blame on clean, harmless-burst, cluster-wide and load-generator scenarios: {false_blames} of {no_culprit}"
    );
    let max_onset = onset_errors.iter().copied().max().unwrap_or(0);
    let within = onset_errors.iter().filter(|&&e| e <= 2).count();
    println!(
        "onset error over {} right verdicts with an onset: mean {:.2} intervals, max {max_onset}, within 2 intervals {within} ({:.1}%)",
        onset_errors.len(),
        onset_errors.iter().sum::<usize>() as f64 / onset_errors.len().max(1) as f64,
        100.0 * within as f64 / onset_errors.len().max(1) as f64,
    );
    println!(
        "kind right on right volumes: {kind_right} of {tp}{}",
        if kind_confusion.is_empty() {
            String::new()
        } else {
            format!(" (expected -> got: {kind_confusion:?})")
        }
    );
    if !forecast_errors.is_empty() {
        let max = forecast_errors.iter().copied().fold(0.0, f64::max);
        let early_max = early_forecast_errors.iter().copied().fold(0.0, f64::max);
        println!(
            "credit forecast vs measured onset: max error {:.1}% over {} cliffs; forecast from the data up to half-way to the cliff (live view): max error {:.1}% over {}",
            100.0 * max,
            forecast_errors.len(),
            100.0 * early_max,
            early_forecast_errors.len()
        );
    }
    println!(
        "analysis of the {} scenarios: {:.2} s for {:.1}M points",
        args.scenarios,
        analysis_secs,
        points as f64 / 1e6
    );
    if !misses.is_empty() {
        println!("\nmisses:");
        for m in misses
            .iter()
            .take(if args.verbose { usize::MAX } else { 25 })
        {
            println!("  {m}");
        }
    }

    // Onsets: all within 2 intervals is the aim; the few that are not are listed above (a burst
    // or a cluster-wide blip right at the onset of the generated noise), so the bar is 99%.
    let onset_ok = within as f64 >= 0.99 * onset_errors.len() as f64;
    let mut ok = precision >= 0.95 && recall >= 0.95 && false_blames == 0 && onset_ok;
    if args.timing {
        ok &= timing(&args, &base);
    }
    println!(
        "\ntargets (precision, recall >= 0.95; no false single-volume blame; onset within 2 intervals for >= 99% of right verdicts; analysis < 10 s): {}",
        if ok { "met" } else { "MISSED" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The live view's forecast: analyze the data up to half-way to the cliff and compare the
/// forecast exhaustion time with the measured onset.
fn early_forecast(sc: &Scenario, opts: &AnalysisOptions, onset_ms: u64) -> Option<f64> {
    let Expected::Volume { node, volume, .. } = &sc.label.expected else {
        return None;
    };
    let cut = (sc.label.onset_interval? / 2).max(5);
    let mut t = sc.timeline.clone();
    for s in &mut t.volumes {
        s.points.truncate(cut);
    }
    let r: ChokepointReport = analyze(&t, opts);
    let f = r
        .forecasts
        .iter()
        .find(|f| &f.node == node && &f.volume == volume)?;
    let at = f.runs_out_at_ms?;
    Some((at as f64 - onset_ms as f64).abs() / onset_ms.max(1) as f64)
}

fn timing(args: &Args, base: &AnalysisOptions) -> bool {
    let spec = ScenarioSpec {
        kind: ScenarioKind::CreditCliff,
        mode: LoadMode::ClosedLoop,
        nodes: args.nodes,
        volumes_per_node: args.volumes,
        roles: 2,
        intervals: args.intervals,
        interval_ms: 1000,
    };
    let points = args.nodes * args.volumes * args.intervals;
    println!(
        "\ntiming: {} nodes x {} volumes x {} intervals = {:.1}M points",
        args.nodes,
        args.volumes,
        args.intervals,
        points as f64 / 1e6
    );
    let start = Instant::now();
    let sc = scenario::generate(&spec, &mut ScenarioRng::new(args.seed ^ 0x5EED));
    let rss_before = rss_kib("VmRSS:").unwrap_or(0);
    println!(
        "  generated in {:.1} s; timeline in memory ~{:.2} GB ({} bytes a point), RSS {:.2} GB",
        start.elapsed().as_secs_f64(),
        (points * std::mem::size_of::<lockstep::results::timeline::VolumePoint>()) as f64 / 1e9,
        std::mem::size_of::<lockstep::results::timeline::VolumePoint>(),
        rss_before as f64 / 1e6 * 1.024,
    );
    let opts = sc.options(base);
    let start = Instant::now();
    let r = analyze(&sc.timeline, &opts);
    let secs = start.elapsed().as_secs_f64();
    let hwm = rss_kib("VmHWM:").unwrap_or(0);
    let right = match (&sc.label.expected, &r.verdict) {
        (Expected::Volume { node, volume, .. }, Verdict::Volume(v)) => {
            &v.node == node && &v.volume == volume
        }
        _ => false,
    };
    println!(
        "  analyze: {secs:.2} s ({:.0} ns a point); peak RSS {:.2} GB (+{:.0} MB over the timeline); verdict {} (labeled {})",
        secs * 1e9 / points.max(1) as f64,
        hwm as f64 / 1e6 * 1.024,
        hwm.saturating_sub(rss_before) as f64 / 1e3 * 1.024,
        describe(&r.verdict),
        describe_expected(&sc.label.expected, sc.label.onset_interval),
    );
    print!("  {}", render_text(&r).lines().next().unwrap_or_default());
    println!();
    // A live call on the first ten minutes of the same run.
    let mut t = sc.timeline;
    for s in &mut t.volumes {
        s.points.truncate(600);
    }
    let start = Instant::now();
    let _ = analyze(&t, &opts);
    println!(
        "  live call on the first 10 minutes: {:.2} s",
        start.elapsed().as_secs_f64()
    );
    secs < 10.0 && right
}

/// One scenario in detail: its label, the report, and the labeled volume's intervals around
/// the labeled onset next to its role's median.
fn show_one(seed: u64, i: usize, base: &AnalysisOptions) {
    let (spec, s) = scenario::suite_spec(seed, i);
    let sc = scenario::generate(&spec, &mut ScenarioRng::new(s));
    println!("scenario #{i}: {spec:?}");
    println!(
        "label: {}, severity {:.3}",
        describe_expected(&sc.label.expected, sc.label.onset_interval),
        sc.label.severity
    );
    let r = analyze(&sc.timeline, &sc.options(base));
    print!("{}", render_text(&r));
    for c in &r.cluster_episodes {
        println!("cluster episode: {c:?}");
    }
    for v in r.volumes.iter().filter(|v| v.suspect || v.peak_score >= 5) {
        println!(
            "suspect {}:{} peak {} flagged {} start {:?}",
            v.node, v.volume, v.peak_score, v.flagged_intervals, v.episode_start_ms
        );
    }
    let (node, volume) = match &sc.label.expected {
        Expected::Volume { node, volume, .. } => (node.clone(), volume.clone()),
        Expected::Node { node } => (node.clone(), String::new()),
        _ => return,
    };
    let onset = sc.label.onset_interval.unwrap_or(0);
    for s in sc
        .timeline
        .volumes
        .iter()
        .filter(|s| s.node == node && (volume.is_empty() || s.volume == volume))
    {
        println!(
            "{}:{} role {} depth {} target {:?}",
            s.node, s.volume, s.role, s.configured_depth, s.target_iops
        );
        println!(
            "{:>5} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7}",
            "k", "iops", "lat_us", "out", "med_iops", "med_lat", "errors"
        );
        for k in onset.saturating_sub(12)..(onset + 12).min(s.points.len()) {
            let p = &s.points[k];
            let mut iops: Vec<f64> = sc
                .timeline
                .volumes
                .iter()
                .filter(|o| o.role == s.role)
                .map(|o| o.points[k].iops())
                .collect();
            let mut lat: Vec<f64> = sc
                .timeline
                .volumes
                .iter()
                .filter(|o| o.role == s.role)
                .map(|o| o.points[k].lat_mean_us)
                .collect();
            iops.sort_by(f64::total_cmp);
            lat.sort_by(f64::total_cmp);
            println!(
                "{k:>5} {:>9.0} {:>9.0} {:>8.1} {:>9.0} {:>9.0} {:>7}",
                p.iops(),
                p.lat_mean_us,
                p.outstanding,
                iops[iops.len() / 2],
                lat[lat.len() / 2],
                p.errors[0] + p.errors[1]
            );
        }
    }
}
