//! Run-to-run comparison (`lockstep compare`): per role, node and volume (and the cluster), the
//! IOPS, MB/s and p50/p99/p99.9 of each run, the change, and whether the change is beyond the
//! runs' own interval-to-interval noise. Pure: the caller reads the results directories.
//!
//! Latency percentiles come from merged histograms (`intervals.hlog`): a role's or node's p99
//! is the p99 of all its volumes' IOs, never an average of their p99s. The noise of a figure is
//! the spread of its per-interval values in each run: a change counts as real when it exceeds
//! `NOISE_SIGMAS` standard errors of the difference of the two runs' interval means
//! (sqrt(sd_a^2/n_a + sd_b^2/n_b)), treating intervals as independent samples.

use std::collections::BTreeMap;

use lockstep_proto::histogram::SparseHistogram;

use crate::results::RunResults;
use crate::results::hlog::LogEntry;

/// How many standard errors a change must exceed to be beyond the noise (about 1 in 370 for a
/// normal difference, so a long list of figures seldom shows a false change).
pub const NOISE_SIGMAS: f64 = 3.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Cluster,
    Role,
    Node,
    Volume,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Role => "role",
            Scope::Node => "node",
            Scope::Volume => "volume",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Iops,
    MBps,
    P50,
    P99,
    P999,
}

pub const METRICS: [Metric; 5] = [
    Metric::Iops,
    Metric::MBps,
    Metric::P50,
    Metric::P99,
    Metric::P999,
];

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MBps => "MB/s",
            Metric::P50 => "p50",
            Metric::P99 => "p99",
            Metric::P999 => "p99.9",
        }
    }
    /// Throughput is better higher, latency lower.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Iops | Metric::MBps)
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// One role, node, volume or the cluster in one run: its figures over the whole run (latency
/// in µs) and per interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub overall: [f64; 5],
    pub per_interval: [Vec<f64>; 5],
}

pub type RunFigures = BTreeMap<(Scope, String), Figures>;

/// The figures of one run from its results (which volume is of which role, bytes per interval
/// from the timeline) and its raw interval histograms (IOs and latency).
pub fn run_figures(r: &RunResults, hlog: &[LogEntry]) -> RunFigures {
    let role_of: BTreeMap<(&str, &str), &str> = r
        .volumes
        .iter()
        .map(|v| ((v.node.as_str(), v.volume.as_str()), v.role.as_str()))
        .collect();
    let keys = |node: &str, volume: &str| -> Vec<(Scope, String)> {
        let mut k = vec![
            (Scope::Cluster, "cluster".to_string()),
            (Scope::Node, node.to_string()),
            (Scope::Volume, format!("{node}/{volume}")),
        ];
        if let Some(role) = role_of.get(&(node, volume)) {
            k.push((Scope::Role, role.to_string()));
        }
        k
    };
    // Per entity, per interval (start in ms): the merged histogram and the interval's length.
    type Intervals = BTreeMap<u64, (SparseHistogram, f64)>;
    let mut merged: BTreeMap<(Scope, String), Intervals> = BTreeMap::new();
    for e in hlog {
        let mut parts = e.tag.split('/');
        let (Some(node), Some(volume), Some(_dir), Some("lat")) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let at = (e.start_s * 1000.0).round() as u64;
        for key in keys(node, volume) {
            match merged.entry(key).or_default().entry(at) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert((e.histogram.clone(), e.len_s));
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    // Same geometry throughout a run; a merge error would be a corrupt log.
                    let _ = o.get_mut().0.merge(&e.histogram);
                }
            }
        }
    }
    let mut bytes: BTreeMap<(Scope, String), BTreeMap<u64, f64>> = BTreeMap::new();
    for s in &r.timeline.volumes {
        // Full intervals only: the run's last one is cut short and its rate is noise.
        let full = |p: &&crate::results::timeline::VolumePoint| {
            p.len_ms * 10 >= r.timeline.interval_ms * 9
        };
        for p in s.points.iter().filter(full) {
            // By interval index: volumes' interval ends differ by a few ms.
            let iv = r.timeline.interval_ms.max(1);
            let index = (p.t_ms + iv / 2) / iv;
            for key in keys(&s.node, &s.volume) {
                *bytes.entry(key).or_default().entry(index).or_default() += p.bytes_per_sec() / 1e6;
            }
        }
    }
    let mut out = RunFigures::new();
    for (key, intervals) in merged {
        let mut f = Figures::default();
        let mut all: Option<SparseHistogram> = None;
        let mut ios = 0u64;
        let mut secs = 0.0;
        for (h, len) in intervals.values() {
            if *len > 0.0 && !h.is_empty() {
                f.per_interval[Metric::Iops.index()].push(h.len() as f64 / len);
                for (m, p) in [
                    (Metric::P50, 50.0),
                    (Metric::P99, 99.0),
                    (Metric::P999, 99.9),
                ] {
                    f.per_interval[m.index()].push(h.value_at_percentile(p) as f64 / 1000.0);
                }
            }
            ios += h.len();
            secs += len;
            match &mut all {
                Some(a) => {
                    let _ = a.merge(h);
                }
                None => all = Some(h.clone()),
            }
        }
        f.overall[Metric::Iops.index()] = if secs > 0.0 { ios as f64 / secs } else { 0.0 };
        if let Some(a) = all.filter(|a| !a.is_empty()) {
            for (m, p) in [
                (Metric::P50, 50.0),
                (Metric::P99, 99.0),
                (Metric::P999, 99.9),
            ] {
                f.overall[m.index()] = a.value_at_percentile(p) as f64 / 1000.0;
            }
        }
        if let Some(b) = bytes.get(&key) {
            let mbs: Vec<f64> = b.values().copied().collect();
            f.overall[Metric::MBps.index()] = mean(&mbs);
            f.per_interval[Metric::MBps.index()] = mbs;
        }
        out.insert(key, f);
    }
    out
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

fn variance(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64
}

/// One figure of one entity in two runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    pub metric: Metric,
    pub a: f64,
    pub b: f64,
    /// (b - a) / a in percent (`NaN` when a is 0).
    pub change_pct: f64,
    /// The noise threshold, in percent of a: `NOISE_SIGMAS` standard errors of the difference.
    pub noise_pct: f64,
    pub beyond_noise: bool,
    /// Worse (lower throughput, higher latency) and beyond the noise.
    pub regression: bool,
}

/// Compares one figure: the overall values and the per-interval values of each run.
pub fn change(metric: Metric, a: f64, a_series: &[f64], b: f64, b_series: &[f64]) -> Change {
    let se = (variance(a_series) / a_series.len().max(1) as f64
        + variance(b_series) / b_series.len().max(1) as f64)
        .sqrt();
    let threshold = NOISE_SIGMAS * se;
    let diff = b - a;
    let change_pct = if a != 0.0 { diff / a * 100.0 } else { f64::NAN };
    let noise_pct = if a != 0.0 {
        threshold / a.abs() * 100.0
    } else {
        f64::NAN
    };
    // With fewer than two intervals in either run there is no noise estimate: nothing counts.
    let beyond_noise = a_series.len() >= 2 && b_series.len() >= 2 && diff.abs() > threshold;
    let worse = if metric.higher_is_better() {
        diff < 0.0
    } else {
        diff > 0.0
    };
    Change {
        metric,
        a,
        b,
        change_pct,
        noise_pct,
        beyond_noise,
        regression: beyond_noise && worse,
    }
}

/// An entity in both runs (or in one: the other side is `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct EntityComparison {
    pub scope: Scope,
    pub name: String,
    /// One per metric when the entity is in both runs, else empty.
    pub changes: Vec<Change>,
    pub only_in: Option<&'static str>,
}

/// Every entity of two runs, cluster first, then roles, nodes and volumes by name.
pub fn compare(a: &RunFigures, b: &RunFigures) -> Vec<EntityComparison> {
    let mut keys: Vec<&(Scope, String)> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let (scope, name) = (key.0, key.1.clone());
            match (a.get(key), b.get(key)) {
                (Some(fa), Some(fb)) => EntityComparison {
                    scope,
                    name,
                    changes: METRICS
                        .iter()
                        .map(|&m| {
                            let i = m.index();
                            change(
                                m,
                                fa.overall[i],
                                &fa.per_interval[i],
                                fb.overall[i],
                                &fb.per_interval[i],
                            )
                        })
                        .collect(),
                    only_in: None,
                },
                (Some(_), None) => EntityComparison {
                    scope,
                    name,
                    changes: vec![],
                    only_in: Some("A"),
                },
                _ => EntityComparison {
                    scope,
                    name,
                    changes: vec![],
                    only_in: Some("B"),
                },
            }
        })
        .collect()
}

/// Regressions beyond the noise and worse than `pct` percent: "(scope name metric change)".
pub fn regressions(c: &[EntityComparison], pct: f64) -> Vec<String> {
    c.iter()
        .flat_map(|e| {
            e.changes
                .iter()
                .filter(move |ch| ch.regression && ch.change_pct.abs() > pct)
                .map(move |ch| {
                    format!(
                        "{} {}: {} {:+.1}% (noise +-{:.1}%)",
                        e.scope.as_str(),
                        e.name,
                        ch.metric.as_str(),
                        ch.change_pct,
                        ch.noise_pct
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(level: f64, spread: f64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| level + if i % 2 == 0 { spread } else { -spread })
            .collect()
    }

    #[test]
    fn a_change_within_the_interval_noise_is_not_a_regression() {
        // 1,000 IOPS +-100 per interval over 45 intervals: the standard error of the difference
        // is about 21, so 3 sigmas is about 64 IOPS (6.4%).
        let a = noisy(1000.0, 100.0, 45);
        let b = noisy(970.0, 100.0, 45);
        let c = change(Metric::Iops, 1000.0, &a, 970.0, &b);
        assert!((c.change_pct + 3.0).abs() < 1e-9);
        assert!(!c.beyond_noise && !c.regression, "{c:?}");
        assert!((c.noise_pct - 6.4).abs() < 0.2, "{c:?}");
        let b = noisy(850.0, 100.0, 45);
        let c = change(Metric::Iops, 1000.0, &a, 850.0, &b);
        assert!(c.beyond_noise && c.regression, "{c:?}");
    }

    #[test]
    fn lower_latency_and_higher_iops_are_improvements_not_regressions() {
        let a = noisy(1000.0, 10.0, 30);
        let b = noisy(2000.0, 10.0, 30);
        let up = change(Metric::Iops, 1000.0, &a, 2000.0, &b);
        assert!(up.beyond_noise && !up.regression);
        let slower = change(Metric::P99, 1000.0, &a, 2000.0, &b);
        assert!(slower.regression);
        let faster = change(Metric::P99, 2000.0, &b, 1000.0, &a);
        assert!(faster.beyond_noise && !faster.regression);
        assert!((faster.change_pct + 50.0).abs() < 1e-9);
    }

    #[test]
    fn one_interval_gives_no_noise_estimate_and_so_no_verdict() {
        let c = change(Metric::P50, 100.0, &[100.0], 500.0, &[500.0]);
        assert!(!c.beyond_noise);
        assert!(
            change(Metric::Iops, 0.0, &[0.0, 0.0], 5.0, &[5.0, 5.0])
                .change_pct
                .is_nan()
        );
    }

    #[test]
    fn a_role_percentile_is_the_percentile_of_its_merged_histograms() {
        let hist = |vals: &[u64]| {
            let mut h =
                hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
            for v in vals {
                h.record(*v).unwrap();
            }
            SparseHistogram::from_dense(&h)
        };
        let entry = |tag: &str, start: f64, vals: &[u64]| LogEntry {
            tag: tag.into(),
            start_s: start,
            len_s: 1.0,
            histogram: hist(vals),
        };
        // Volume a: 99 IOs of 1 ms per interval; b: one of 100 ms. Merged, the role's p50 is
        // 1 ms and its p99.9 100 ms, which no average of the volumes' percentiles gives.
        let fast = vec![1_000_000u64; 99];
        let log = vec![
            entry("n1/a/read/lat", 0.0, &fast),
            entry("n1/b/read/lat", 0.0, &[100_000_000]),
            entry("n1/a/read/lat", 1.0, &fast),
            entry("n1/b/read/lat", 1.0, &[100_000_000]),
            entry("n1/b/read/lat_intended", 1.0, &[900_000_000]),
        ];
        let summary = serde_json::to_value(crate::results::Summary::default()).unwrap();
        let r: RunResults = serde_json::from_value(serde_json::json!({
            "lockstep_version": "0", "run_id": "r", "plan": "p", "status": "completed",
            "start_unix_ms": 0, "duration_ms": 2000, "interval_ms": 1000, "phases": [],
            "agents": [], "start_skew_ns": null, "cluster": summary, "nodes": [],
            "volumes": [
                {"node": "n1", "volume": "a", "role": "w", "summary": summary, "outstanding_mean": 1.0, "configured_depth": 1},
                {"node": "n1", "volume": "b", "role": "w", "summary": summary, "outstanding_mean": 1.0, "configured_depth": 1}],
            "cluster_timeline": [], "objectives": [],
        }))
        .unwrap();
        let f = run_figures(&r, &log);
        let role = &f[&(Scope::Role, "w".to_string())];
        assert_eq!(role.overall[Metric::Iops.index()], 100.0);
        assert_eq!(role.per_interval[Metric::Iops.index()], vec![100.0, 100.0]);
        assert!(
            (role.overall[Metric::P50.index()] - 1000.0).abs() < 2.0,
            "{role:?}"
        );
        assert!(
            (role.overall[Metric::P999.index()] - 100_000.0).abs() < 100.0,
            "{role:?}"
        );
        let b = &f[&(Scope::Volume, "n1/b".to_string())];
        assert_eq!(b.overall[Metric::Iops.index()], 1.0);
        assert!(f.contains_key(&(Scope::Node, "n1".to_string())));
        assert!(f.contains_key(&(Scope::Cluster, "cluster".to_string())));
    }

    #[test]
    fn entities_are_matched_by_scope_and_name_and_the_missing_ones_named() {
        let f = |iops: f64| Figures {
            overall: [iops, 1.0, 1.0, 1.0, 1.0],
            per_interval: std::array::from_fn(|_| noisy(iops, 1.0, 10)),
        };
        let a: RunFigures = [
            ((Scope::Cluster, "cluster".to_string()), f(300.0)),
            ((Scope::Volume, "n1/data".to_string()), f(100.0)),
            ((Scope::Volume, "n2/data".to_string()), f(200.0)),
        ]
        .into();
        let b: RunFigures = [
            ((Scope::Cluster, "cluster".to_string()), f(150.0)),
            ((Scope::Volume, "n1/data".to_string()), f(50.0)),
            ((Scope::Volume, "n3/data".to_string()), f(100.0)),
        ]
        .into();
        let c = compare(&a, &b);
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].scope, Scope::Cluster);
        assert_eq!(c[2].only_in, Some("A"));
        assert_eq!(c[3].only_in, Some("B"));
        let r = regressions(&c, 10.0);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].starts_with("cluster cluster: IOPS -50.0%"), "{r:?}");
        assert!(regressions(&c, 60.0).is_empty());
    }
}
