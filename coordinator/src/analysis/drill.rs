//! The drill report: what each injected fault did to the volumes it hit and to the cluster.
//!
//! Pure: the raw interval histograms of a run (`intervals.hlog` entries), the per-interval
//! counts of its timeline and the fault windows the agents recorded go in; a report comes out.
//! For every fault (windows of one kind that started and ended together are one fault, hitting
//! several volumes) it gives, per affected volume and for the whole cluster:
//!
//! - three windows: `baseline` (the intervals that ended before the fault, at most
//!   `baseline_ms` of them), `during` (every interval that overlaps the fault) and `after` (the
//!   intervals that start after it ended, at most `after_ms`);
//! - in each window IOPS, errors and p50/p99/p99.9 of the latency from the actual issue (`lat`)
//!   and, for open-loop workloads, from the intended issue (`lat_intended`, no coordinated
//!   omission). Percentiles come from the merge of the window's interval histograms (both
//!   directions), never from averaged percentiles; HdrHistogram's 3 significant digits bound
//!   their error at 0.1%;
//! - recovery: the first instant after the fault's end from which `consecutive` intervals in a
//!   row have a p99 (intended when there is one) within `tolerance` x the baseline p99 (or
//!   within `slack_us` of it: sub-millisecond baselines jitter by more than 50% from one interval
//!   to the next on a quiet local disk). Its resolution is one interval: a fault that ends
//!   mid-interval leaves that interval slow, so recovery is reported at the next boundary.
//!
//! Fault windows are converted from each agent's clock and land a few ms off interval
//! boundaries; edges within `min(50 ms, interval / 10)` of a boundary are snapped to it so a
//! fault planned at t = 20 s does not pull the interval before it into its `during` window.

use std::collections::BTreeMap;

use lockstep_proto::histogram::SparseHistogram;

/// The report types live in the results model; this module produces them.
pub use crate::results::drill::{
    DrillOptions, DrillReport, DrillTarget, FaultDrill, Percentiles, Recovery, WindowStats,
};

use lockstep_core::verify::VerifyReport;

use crate::results::hlog::LogEntry;
use crate::results::timeline::{FaultWindow, Timeline};
use crate::results::{RunResults, StuckIoResult, VolumeVerify};

/// One interval of one volume (or of the cluster): both directions.
#[derive(Debug, Clone, Default)]
struct Cell {
    lat: Option<SparseHistogram>,
    lat_intended: Option<SparseHistogram>,
    ios: u64,
    errors: u64,
    /// From the timeline when known (the last interval may be short).
    len_ms: Option<u64>,
    /// IOs counted from the histograms (used when the timeline has no point).
    hist_ios: u64,
}

fn merge_opt(slot: &mut Option<SparseHistogram>, h: &SparseHistogram) {
    match slot {
        Some(s) => {
            // Same geometry everywhere in a run (one agent version); a mismatch only loses
            // this sample from the drill figures, never the run.
            let _ = s.merge(h);
        }
        None => *slot = Some(h.clone()),
    }
}

impl Cell {
    fn add(&mut self, other: &Cell) {
        if let Some(h) = &other.lat {
            merge_opt(&mut self.lat, h);
        }
        if let Some(h) = &other.lat_intended {
            merge_opt(&mut self.lat_intended, h);
        }
        self.ios += other.ios;
        self.errors += other.errors;
        self.hist_ios += other.hist_ios;
        self.len_ms = match (self.len_ms, other.len_ms) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    fn judged_p99(&self) -> Option<u64> {
        let h = self.lat_intended.as_ref().or(self.lat.as_ref())?;
        (!h.is_empty()).then(|| h.value_at_percentile(99.0))
    }
}

type Series = BTreeMap<u64, Cell>;

/// Per volume (`node/volume`), per interval index.
fn build_series(
    entries: &[LogEntry],
    timeline: &Timeline,
    interval_ms: u64,
) -> BTreeMap<String, Series> {
    let mut out: BTreeMap<String, Series> = BTreeMap::new();
    for e in entries {
        let mut parts = e.tag.rsplitn(3, '/');
        let (Some(kind), Some(_dir), Some(volume)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let index = ((e.start_s * 1000.0) / interval_ms as f64).round().max(0.0) as u64;
        let cell = out
            .entry(volume.to_string())
            .or_default()
            .entry(index)
            .or_default();
        match kind {
            "lat" => {
                cell.hist_ios += e.histogram.len();
                merge_opt(&mut cell.lat, &e.histogram);
            }
            "lat_intended" => merge_opt(&mut cell.lat_intended, &e.histogram),
            _ => {}
        }
    }
    let mut counted: BTreeMap<String, ()> = BTreeMap::new();
    for v in &timeline.volumes {
        let key = format!("{}/{}", v.node, v.volume);
        let series = out.entry(key.clone()).or_default();
        counted.insert(key, ());
        for p in &v.points {
            let index = (p.t_ms / interval_ms).saturating_sub(1);
            let cell = series.entry(index).or_default();
            cell.ios = p.ios[0] + p.ios[1];
            cell.errors = p.errors[0] + p.errors[1];
            cell.len_ms = Some(p.len_ms);
        }
    }
    // Volumes with histograms but no timeline (a log read on its own): count from histograms.
    for (key, series) in out.iter_mut() {
        if !counted.contains_key(key) {
            for cell in series.values_mut() {
                cell.ios = cell.hist_ios;
            }
        }
    }
    out
}

/// `t` snapped to the nearest interval boundary when it is within `min(50 ms, interval/10)`.
fn snap(t: u64, interval_ms: u64) -> u64 {
    let tol = (interval_ms / 10).min(50);
    let below = t / interval_ms * interval_ms;
    let above = below + interval_ms;
    if t - below <= tol {
        below
    } else if above - t <= tol {
        above
    } else {
        t
    }
}

fn window(series: &Series, first: u64, last_excl: u64, interval_ms: u64) -> Option<WindowStats> {
    if first >= last_excl {
        return None;
    }
    let mut acc = Cell::default();
    let mut intervals = 0u32;
    let mut len_ms = 0u64;
    let (mut lo, mut hi) = (u64::MAX, 0);
    for (&k, c) in series.range(first..last_excl) {
        acc.add(c);
        intervals += 1;
        let len = c.len_ms.unwrap_or(interval_ms);
        len_ms += len;
        lo = lo.min(k * interval_ms);
        hi = hi.max(k * interval_ms + len);
    }
    if intervals == 0 {
        return None;
    }
    let lat = acc.lat.as_ref().map(Percentiles::of).unwrap_or_default();
    Some(WindowStats {
        // What was measured: a window cut by the run's end ends there.
        start_ms: lo,
        end_ms: hi,
        intervals,
        ios: acc.ios,
        errors: acc.errors,
        iops: if len_ms == 0 {
            0.0
        } else {
            acc.ios as f64 * 1000.0 / len_ms as f64
        },
        lat,
        lat_intended: acc
            .lat_intended
            .as_ref()
            .filter(|h| !h.is_empty())
            .map(Percentiles::of),
    })
}

fn recovery(
    series: &Series,
    baseline: Option<&WindowStats>,
    end_ms: Option<u64>,
    last_index: u64,
    interval_ms: u64,
    o: &DrillOptions,
) -> Recovery {
    let Some(end_ms) = end_ms else {
        return Recovery {
            note: "the fault lasted until the end of the run".into(),
            ..Default::default()
        };
    };
    let Some(base) = baseline.map(WindowStats::judged).filter(|p| p.n > 0) else {
        return Recovery {
            note: "no baseline: nothing was measured before the fault".into(),
            ..Default::default()
        };
    };
    let threshold =
        ((base.p99_ns as f64 * o.tolerance).max(base.p99_ns as f64 + o.slack_us * 1000.0)) as u64;
    let need = o.consecutive.max(1) as u64;
    // Intervals that contain the fault's end or come after it.
    let first = end_ms / interval_ms;
    let ok = |k: u64| {
        series
            .get(&k)
            .and_then(Cell::judged_p99)
            .is_some_and(|p| p <= threshold)
    };
    let mut k = first;
    while k + need <= last_index + 1 {
        if let Some(bad) = (k..k + need).rev().find(|&j| !ok(j)) {
            k = bad + 1;
            continue;
        }
        let at = (k * interval_ms).max(end_ms);
        return Recovery {
            threshold_ns: Some(threshold),
            recovered_at_ms: Some(at),
            recovery_ms: Some(at - end_ms),
            note: String::new(),
        };
    }
    Recovery {
        threshold_ns: Some(threshold),
        note: format!(
            "not back within the tolerance for {need} intervals in a row by the end of the run (t={:.1}s)",
            ((last_index + 1) * interval_ms) as f64 / 1000.0
        ),
        ..Default::default()
    }
}

fn target(
    name: String,
    series: &Series,
    start_ms: u64,
    end_ms: Option<u64>,
    last_index: u64,
    interval_ms: u64,
    o: &DrillOptions,
) -> DrillTarget {
    let run_end = (last_index + 1) * interval_ms;
    let s = snap(start_ms, interval_ms);
    let e = end_ms.map(|e| snap(e, interval_ms).max(s + 1));
    // Baseline: whole intervals that ended by the fault's start.
    let b_last = s / interval_ms;
    let b_first = s.saturating_sub(o.baseline_ms).div_ceil(interval_ms);
    let baseline = window(series, b_first, b_last, interval_ms);
    // During: every interval overlapping [s, e).
    let d_end = e.unwrap_or(run_end);
    let during = window(
        series,
        s / interval_ms,
        d_end.div_ceil(interval_ms),
        interval_ms,
    );
    let after = e.and_then(|e| {
        let first = e.div_ceil(interval_ms);
        window(series, first, (e + o.after_ms) / interval_ms, interval_ms)
    });
    let recovery = recovery(series, baseline.as_ref(), e, last_index, interval_ms, o);
    DrillTarget {
        target: name,
        baseline,
        during,
        after,
        recovery,
    }
}

/// Analyzes every fault of a run. `entries` are `intervals.hlog`'s histograms; `timeline`
/// gives IO and error counts per interval (and `interval_ms`); `faults` the recorded windows.
pub fn analyze(
    entries: &[LogEntry],
    timeline: &Timeline,
    faults: &[FaultWindow],
    o: &DrillOptions,
) -> DrillReport {
    let interval_ms = timeline.interval_ms.max(1);
    let series = build_series(entries, timeline, interval_ms);
    let last_index = series
        .values()
        .filter_map(|s| s.keys().next_back().copied())
        .max()
        .unwrap_or(0);
    let mut cluster: Series = BTreeMap::new();
    for s in series.values() {
        for (k, c) in s {
            cluster.entry(*k).or_default().add(c);
        }
    }
    // Group the per-volume windows: same kind, starts and ends within half an interval.
    let close = |a: u64, b: u64| a.abs_diff(b) <= interval_ms / 2;
    let mut groups: Vec<(String, u64, Option<u64>, Vec<&FaultWindow>)> = Vec::new();
    let mut sorted: Vec<&FaultWindow> = faults.iter().collect();
    sorted.sort_by_key(|f| (f.start_ms, f.node.clone(), f.volume.clone()));
    for f in sorted {
        let found = groups.iter_mut().find(|(kind, s, e, _)| {
            *kind == f.fault
                && close(*s, f.start_ms)
                && match (e, f.end_ms) {
                    (Some(a), Some(b)) => close(*a, b),
                    (None, None) => true,
                    _ => false,
                }
        });
        match found {
            Some(g) => g.3.push(f),
            None => groups.push((f.fault.clone(), f.start_ms, f.end_ms, vec![f])),
        }
    }
    let empty = Series::new();
    let faults = groups
        .into_iter()
        .map(|(kind, start_ms, end_ms, members)| {
            let mut names: Vec<String> = members
                .iter()
                .map(|f| format!("{}/{}", f.node, f.volume))
                .collect();
            names.sort();
            names.dedup();
            let mut details: Vec<String> = members
                .iter()
                .filter_map(|f| Some(format!("{}: {}", f.node, f.detail.as_ref()?)))
                .collect();
            details.sort();
            details.dedup();
            let volumes = names
                .into_iter()
                .map(|n| {
                    let s = series.get(&n).unwrap_or(&empty);
                    target(n, s, start_ms, end_ms, last_index, interval_ms, o)
                })
                .collect();
            FaultDrill {
                fault: kind,
                start_ms,
                end_ms,
                details,
                volumes,
                cluster: target(
                    "cluster".into(),
                    &cluster,
                    start_ms,
                    end_ms,
                    last_index,
                    interval_ms,
                    o,
                ),
            }
        })
        .collect();
    DrillReport {
        options: o.clone(),
        interval_ms,
        faults,
    }
}

/// Stuck IOs and verification findings from the agents' final results, into `r` (with a
/// warning per volume whose stuck list was cut or whose verification found bad blocks).
pub fn collect_finals(r: &mut RunResults) {
    for (node, v) in &r.finals {
        for s in &v.stuck {
            r.stuck_ios.push(StuckIoResult {
                node: node.clone(),
                volume: v.volume.clone(),
                file: s.file.clone(),
                offset: s.offset,
                len: s.len,
                direction: s.direction.clone(),
                start_ms: s.start_ms,
                latency_ms: s.latency_ms,
                completed: s.completed,
            });
        }
        if v.stuck_count > v.stuck.len() as u64 {
            r.warnings.push(format!(
                "{node}/{}: {} stuck IOs, the first {} listed",
                v.volume,
                v.stuck_count,
                v.stuck.len()
            ));
        }
        if v.verify_json.is_empty() {
            continue;
        }
        match serde_json::from_str::<VerifyReport>(&v.verify_json) {
            Ok(report) => r.verify.push(VolumeVerify {
                node: node.clone(),
                volume: v.volume.clone(),
                report,
            }),
            Err(e) => r.warnings.push(format!(
                "{node}/{}: unreadable verification result: {e}",
                v.volume
            )),
        }
    }
    r.stuck_ios
        .sort_by(|a, b| (a.start_ms, &a.node, &a.volume).cmp(&(b.start_ms, &b.node, &b.volume)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::timeline::{VolumePoint, VolumeSeries};
    use hdrhistogram::Histogram;

    const I: u64 = 1000;

    fn hist(values: &[(u64, u64)]) -> SparseHistogram {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for &(v, n) in values {
            h.record_n(v, n).unwrap();
        }
        SparseHistogram::from_dense(&h)
    }

    fn entry(tag: &str, index: u64, h: SparseHistogram) -> LogEntry {
        LogEntry {
            tag: tag.into(),
            start_s: (index * I) as f64 / 1000.0,
            len_s: 1.0,
            histogram: h,
        }
    }

    /// A volume at 1,000 IOPS of 100 µs (intended and actual) except where `slow` says:
    /// (index, intended latency, actual latency).
    fn volume(
        node: &str,
        n: u64,
        slow: &[(u64, u64, u64)],
        errors_at: &[(u64, u64)],
    ) -> (Vec<LogEntry>, VolumeSeries) {
        let mut entries = Vec::new();
        let mut points = Vec::new();
        for k in 0..n {
            let (li, la) = slow
                .iter()
                .find(|s| s.0 == k)
                .map_or((100_000, 100_000), |s| (s.1, s.2));
            entries.push(entry(
                &format!("{node}/data/write/lat"),
                k,
                hist(&[(la, 1000)]),
            ));
            entries.push(entry(
                &format!("{node}/data/write/lat_intended"),
                k,
                hist(&[(li, 1000)]),
            ));
            let errors = errors_at.iter().find(|e| e.0 == k).map_or(0, |e| e.1);
            points.push(VolumePoint {
                t_ms: (k + 1) * I,
                len_ms: I,
                ios: [0, 1000 + errors],
                errors: [0, errors],
                ..Default::default()
            });
        }
        let series = VolumeSeries {
            node: node.into(),
            volume: "data".into(),
            role: "r".into(),
            points,
            ..Default::default()
        };
        (entries, series)
    }

    fn fw(node: &str, kind: &str, s: u64, e: Option<u64>) -> FaultWindow {
        FaultWindow {
            node: node.into(),
            volume: "data".into(),
            fault: kind.into(),
            start_ms: s,
            end_ms: e,
            detail: None,
        }
    }

    fn run(vols: Vec<(Vec<LogEntry>, VolumeSeries)>, faults: &[FaultWindow]) -> DrillReport {
        let mut entries = Vec::new();
        let mut tl = Timeline {
            interval_ms: I,
            ..Default::default()
        };
        for (e, s) in vols {
            entries.extend(e);
            tl.volumes.push(s);
        }
        analyze(&entries, &tl, faults, &DrillOptions::default())
    }

    #[test]
    fn a_stall_shows_in_intended_latency_and_recovery_is_timed_from_its_end() {
        // Stall 20.0-20.2 s: interval 20 holds the backlog (intended 200 ms, actual 150 µs),
        // interval 21 still drains (2 ms), from 22 on all is normal.
        let a = volume(
            "a",
            40,
            &[(20, 200_000_000, 150_000), (21, 2_000_000, 100_000)],
            &[],
        );
        let b = volume("b", 40, &[], &[]);
        let r = run(vec![a, b], &[fw("a", "stall", 20_003, Some(20_201))]);
        assert_eq!(r.faults.len(), 1);
        let f = &r.faults[0];
        assert_eq!(f.volumes.len(), 1);
        let v = &f.volumes[0];
        assert_eq!(v.target, "a/data");
        let base = v.baseline.as_ref().unwrap();
        // Snapped start: baseline is 10..20 s, not 10..21.
        assert_eq!(
            (base.start_ms, base.end_ms, base.intervals),
            (10_000, 20_000, 10)
        );
        assert!((base.iops - 1000.0).abs() < 1e-9);
        let during = v.during.as_ref().unwrap();
        assert_eq!((during.start_ms, during.end_ms), (20_000, 21_000));
        let di = during.lat_intended.unwrap();
        assert!((199_000_000..=201_000_000).contains(&di.p99_ns), "{di:?}");
        assert!(
            during.lat.p999_ns < 200_000,
            "uncorrected hides the stall: {:?}",
            during.lat
        );
        let after = v.after.as_ref().unwrap();
        assert_eq!((after.start_ms, after.end_ms), (21_000, 30_000));
        // Recovered at 22 s (interval 21 is 2 ms > 1.5 x 100 µs): 1.799 s after the end at 20.201 s.
        assert_eq!(v.recovery.recovered_at_ms, Some(22_000));
        assert_eq!(v.recovery.recovery_ms, Some(1_799));
        assert_eq!(v.recovery.threshold_ns, Some(200_031)); // max(1.5 x p99, p99 + 100 µs); p99 is 100,031 (bucket top)
        // The cluster merges both volumes: p99 of interval 20 is dominated by a's backlog.
        let c = &f.cluster;
        assert_eq!(c.during.as_ref().unwrap().ios, 2000);
        assert_eq!(c.recovery.recovered_at_ms, Some(22_000));
    }

    #[test]
    fn windows_of_one_fault_on_several_volumes_are_grouped() {
        let a = volume("a", 20, &[(8, 5_000_000, 5_000_000)], &[]);
        let b = volume("b", 20, &[(8, 5_000_000, 5_000_000)], &[]);
        let c = volume("c", 20, &[], &[]);
        let r = run(
            vec![a, b, c],
            &[
                fw("b", "latency", 8_001, Some(9_000)),
                fw("a", "latency", 7_999, Some(9_002)),
                fw("a", "eio", 12_000, Some(13_000)),
            ],
        );
        assert_eq!(r.faults.len(), 2);
        let names: Vec<&str> = r.faults[0]
            .volumes
            .iter()
            .map(|v| v.target.as_str())
            .collect();
        assert_eq!(names, ["a/data", "b/data"]);
        assert_eq!(r.faults[1].fault, "eio");
        // Recovery right at the end: intervals 9, 10, 11 are normal.
        assert_eq!(r.faults[0].volumes[0].recovery.recovery_ms, Some(0));
    }

    #[test]
    fn errors_and_iops_come_from_the_timeline() {
        let a = volume("a", 20, &[], &[(10, 50), (11, 50)]);
        let r = run(vec![a], &[fw("a", "eio", 10_000, Some(12_000))]);
        let v = &r.faults[0].volumes[0];
        let d = v.during.as_ref().unwrap();
        assert_eq!((d.errors, d.ios, d.intervals), (100, 2100, 2));
        assert!((d.iops - 1050.0).abs() < 1e-9);
        assert_eq!(v.baseline.as_ref().unwrap().errors, 0);
    }

    #[test]
    fn a_fault_that_never_ends_or_never_recovers_says_so() {
        // Latency up 10x from 10 s to the end.
        let slow: Vec<(u64, u64, u64)> = (10..20).map(|k| (k, 1_000_000, 1_000_000)).collect();
        let a = volume("a", 20, &slow, &[]);
        let r = run(vec![a], &[fw("a", "ebs", 5_000, None)]);
        assert_eq!(
            r.faults[0].volumes[0].baseline.as_ref().unwrap().start_ms,
            0
        );
        let v = &r.faults[0].volumes[0];
        assert!(v.after.is_none());
        assert_eq!(v.during.as_ref().unwrap().end_ms, 20_000);
        assert!(v.recovery.recovered_at_ms.is_none());
        assert!(
            v.recovery.note.contains("until the end"),
            "{}",
            v.recovery.note
        );
        let slow: Vec<(u64, u64, u64)> = (15..20).map(|k| (k, 1_000_000, 1_000_000)).collect();
        let a = volume("a", 20, &slow, &[]);
        let r = run(vec![a], &[fw("a", "latency", 15_000, Some(16_000))]);
        // The after window is cut at the run's end (20 s), not 10 s after the fault.
        assert_eq!(
            r.faults[0].volumes[0].after.as_ref().unwrap().end_ms,
            20_000
        );
        let rec = &r.faults[0].volumes[0].recovery;
        assert!(rec.recovered_at_ms.is_none());
        assert!(rec.note.contains("by the end of the run"), "{}", rec.note);
        // A fault at the very start has no baseline.
        let a = volume("a", 5, &[], &[]);
        let r = run(vec![a], &[fw("a", "stall", 0, Some(500))]);
        let v = &r.faults[0].volumes[0];
        assert!(v.baseline.is_none());
        assert!(v.recovery.note.contains("no baseline"));
    }

    #[test]
    fn a_gap_in_the_data_is_not_a_recovery() {
        // Intervals 11 and 12 missing (agent silent): recovery needs 3 measured intervals.
        let (mut e, mut s) = volume("a", 20, &[(10, 9_000_000, 9_000_000)], &[]);
        e.retain(|x| x.start_s != 11.0 && x.start_s != 12.0);
        s.points.retain(|p| p.t_ms != 12_000 && p.t_ms != 13_000);
        let r = run(vec![(e, s)], &[fw("a", "stall", 10_000, Some(10_500))]);
        assert_eq!(
            r.faults[0].volumes[0].recovery.recovered_at_ms,
            Some(13_000)
        );
    }

    #[test]
    fn closed_loop_runs_are_judged_by_actual_latency_and_the_text_has_every_window() {
        // Only `lat` histograms (no rate): judged by actual latency.
        let mut entries = Vec::new();
        for k in 0..12 {
            let l = if k == 6 { 50_000_000 } else { 200_000 };
            entries.push(entry("n/data/read/lat", k, hist(&[(l, 500)])));
        }
        let tl = Timeline {
            interval_ms: I,
            ..Default::default()
        };
        let r = analyze(
            &entries,
            &tl,
            &[fw("n", "latency", 6_000, Some(7_000))],
            &DrillOptions::default(),
        );
        let v = &r.faults[0].volumes[0];
        let d = v.during.as_ref().unwrap();
        assert!(d.lat_intended.is_none());
        assert_eq!(d.ios, 500, "counted from the histograms without a timeline");
        assert_eq!(v.recovery.recovered_at_ms, Some(7_000));
        let text = crate::export::text::drill::render_text(&r);
        for want in [
            "latency on n/data",
            "baseline",
            "during",
            "after",
            "recovered: p99 at or below 0.30 ms from t=7.0s",
        ] {
            assert!(text.contains(want), "missing '{want}' in\n{text}");
        }
    }

    /// A run's results with nothing in them but what these tests set.
    fn empty_results() -> RunResults {
        let summary = serde_json::to_value(crate::results::Summary::default()).unwrap();
        serde_json::from_value(serde_json::json!({
            "lockstep_version": "0", "run_id": "r", "plan": "p", "status": "completed",
            "start_unix_ms": 0, "duration_ms": 1000, "interval_ms": 1000, "phases": [],
            "agents": [], "start_skew_ns": null, "cluster": summary, "nodes": [], "volumes": [],
            "cluster_timeline": [], "objectives": [],
        }))
        .unwrap()
    }

    #[test]
    fn finals_give_stuck_ios_and_verification_and_the_report_shows_them() {
        use lockstep_core::verify::{Finding, FindingKind};
        let report = VerifyReport {
            blocks: 10,
            good: 9,
            stale: 1,
            findings: vec![Finding {
                kind: FindingKind::Stale,
                file: "/v/w.0.0".into(),
                offset: 8192,
                len: 4096,
                expected: 3,
                found: Some(2),
                detail: String::new(),
            }],
            dropped_writes: 4,
            ..Default::default()
        };
        let stuck = |start_ms: u64| lockstep_proto::v1::StuckIo {
            offset: 4096,
            len: 4096,
            direction: "write".into(),
            start_ms,
            latency_ms: 6000,
            file: "/v/w.0.0".into(),
            completed: false,
        };
        let finals = vec![
            (
                "b".to_string(),
                lockstep_proto::v1::VolumeResult {
                    volume: "data".into(),
                    stuck: vec![stuck(900), stuck(100)],
                    stuck_count: 150,
                    verify_json: serde_json::to_string(&report).unwrap(),
                    ..Default::default()
                },
            ),
            (
                "a".to_string(),
                lockstep_proto::v1::VolumeResult {
                    volume: "data".into(),
                    verify_json: "{".into(),
                    ..Default::default()
                },
            ),
        ];
        let mut r = empty_results();
        assert!(!r.verify_failed());
        r.finals = finals;
        collect_finals(&mut r);
        // Sorted by issue time; the cut list and the unreadable result are warnings.
        assert_eq!(
            r.stuck_ios.iter().map(|s| s.start_ms).collect::<Vec<_>>(),
            [100, 900]
        );
        assert_eq!(r.stuck_ios[0].node, "b");
        assert_eq!(r.verify.len(), 1);
        assert!(r.verify_failed());
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("b/data: 150 stuck IOs, the first 2 listed")),
            "{:?}",
            r.warnings
        );
        assert!(
            r.warnings
                .iter()
                .any(|w| w.starts_with("a/data: unreadable verification result")),
            "{:?}",
            r.warnings
        );
        let text = crate::export::text::drill::render_stuck_and_verify(&r);
        for want in [
            "b/data: write of 4096 bytes at offset 4096 of /v/w.0.0, issued at t=0.1s, STILL IN FLIGHT after 6000 ms",
            "b/data: FAILED: 10 blocks, 9 good, 0 lost, 1 stale, 0 corrupt",
            "drop_writes fault: 4 writes dropped",
            "Stale /v/w.0.0@8192 len 4096: expected generation 3, found generation 2",
        ] {
            assert!(text.contains(want), "missing '{want}' in\n{text}");
        }
        assert_eq!(
            crate::export::text::drill::render_stuck_and_verify(&empty_results()),
            ""
        );
    }

    #[test]
    fn edges_snap_to_interval_boundaries_only_when_close() {
        assert_eq!(snap(20_003, 1000), 20_000);
        assert_eq!(snap(19_960, 1000), 20_000);
        assert_eq!(snap(20_200, 1000), 20_200);
        assert_eq!(snap(150, 100), 150);
        assert_eq!(snap(109, 100), 100);
    }
}
