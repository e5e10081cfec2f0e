//! The per-volume points the coordinator keeps in memory during a run, bounded whatever the
//! run's length: every point goes to `data/points.bin` as it arrives (results/store), and memory
//! keeps two views of it:
//! - the *recent* points at full resolution (the last few minutes), for the live view and the
//!   live chokepoint finder;
//! - the *kept* timeline, one point per `fold` intervals, for the final analysis and the
//!   report. `fold` is 1 (every interval) unless the planned run would hold more than
//!   [`POINT_BUDGET`] points: a 12-hour run of 1,000 agents x 8 volumes keeps one point per
//!   87 s per volume instead of 345 million points (34 GB).
//!
//! A kept point of several intervals adds their counts exactly and takes the IO-weighted mean
//! latency exactly; its p50 and p99 are estimates from the intervals' own percentiles
//! ([`fold`]), used only to find and plot a slowdown. Every reported percentile (volume, node,
//! cluster, windows, drills) comes from merged histograms, never from these points.

use std::collections::VecDeque;

use crate::results::timeline::VolumePoint;

/// Points kept per run (all volumes together): about 100 bytes each, so ~400 MB at most.
pub const POINT_BUDGET: u64 = 4_000_000;
/// Recent points kept at full resolution (all volumes together).
pub const RECENT_BUDGET: usize = 1_000_000;
/// Whatever the cluster's width, the live view sees at least this many recent intervals (the
/// finder's persistence and history need a few dozen) and needs no more than this many.
const RECENT_MIN: usize = 30;
const RECENT_MAX: usize = 120;

/// Intervals per kept point for a run of `intervals` intervals of `volumes` volumes.
pub fn fold_for(intervals: u64, volumes: usize) -> u64 {
    let total = intervals.saturating_mul(volumes.max(1) as u64);
    total.div_ceil(POINT_BUDGET).max(1)
}

/// Full-resolution intervals kept per volume for the live view.
pub fn recent_for(volumes: usize) -> usize {
    (RECENT_BUDGET / volumes.max(1)).clamp(RECENT_MIN, RECENT_MAX)
}

/// How a run keeps its points: the same for every volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub interval_ms: u64,
    /// Intervals per kept point.
    pub fold: u64,
    /// Full-resolution points kept per volume.
    pub recent: usize,
    /// Whether the kept timeline is in memory. A run that writes its data files keeps only the
    /// recent points, so its memory stays flat; its timeline is read back from
    /// `data/points.bin` at the end, folded the same way.
    pub in_memory: bool,
}

impl Keep {
    /// For a run of `intervals` planned intervals of `volumes` volumes.
    pub fn for_run(interval_ms: u64, intervals: u64, volumes: usize) -> Self {
        Keep {
            interval_ms,
            fold: fold_for(intervals, volumes),
            recent: recent_for(volumes),
            in_memory: true,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct KeptPoints {
    /// One point per `fold` intervals (the last may be partial until the run ends).
    pub points: Vec<VolumePoint>,
    partial: Vec<VolumePoint>,
    partial_slot: Option<u64>,
    pub recent: VecDeque<VolumePoint>,
}

impl KeptPoints {
    /// Claims the memory of `n` recent points now, touched, rather than as the window fills:
    /// a run's memory is then what it will be for the whole run from its first minute (the
    /// window of 1,000 agents x 8 volumes is 120 intervals, about 90 MiB, which had been most
    /// of the growth after the first minute), and a coordinator short of memory finds out at
    /// the start rather than two minutes in. The ring never reallocates after.
    pub fn claim_recent(&mut self, n: usize) {
        let mut recent = VecDeque::with_capacity(n);
        recent.resize(n, VolumePoint::default());
        recent.clear();
        self.recent = recent;
    }

    /// Adds the point of interval `index`.
    pub fn push(&mut self, index: u64, p: VolumePoint, keep: &Keep) {
        if keep.recent > 0 {
            if self.recent.len() >= keep.recent {
                self.recent.pop_front();
            }
            self.recent.push_back(p);
        }
        if !keep.in_memory {
            return;
        }
        if keep.fold <= 1 {
            self.points.push(p);
            return;
        }
        let slot = index / keep.fold;
        match self.partial_slot {
            Some(s) if s == slot => self.partial.push(p),
            // A late interval of a slot already folded: left to data/points.bin.
            Some(s) if slot < s => {}
            _ => {
                if let Some(p) = self.folded(keep) {
                    self.points.push(p);
                }
                self.partial.clear();
                self.partial_slot = Some(slot);
                self.partial.push(p);
            }
        }
    }

    /// The partial slot as one point, ending where its slot ends (kept point `k` always ends
    /// at `(k + 1) x fold` intervals, even when the slot's last interval is missing).
    fn folded(&self, keep: &Keep) -> Option<VolumePoint> {
        let slot = self.partial_slot?;
        let mut p = fold(&self.partial);
        if self.partial.is_empty() {
            return None;
        }
        p.t_ms = (slot + 1) * keep.fold * keep.interval_ms;
        Some(p)
    }

    /// Kept points with room for `n` of them.
    pub fn with_room(n: usize) -> Self {
        KeptPoints {
            points: Vec::with_capacity(n),
            ..Default::default()
        }
    }

    /// The kept points including the partial last one, without copying them.
    pub fn into_all(mut self, keep: &Keep) -> Vec<VolumePoint> {
        if keep.fold > 1
            && let Some(p) = self.folded(keep)
        {
            self.points.push(p);
        }
        self.points
    }

    /// The kept points including the partial last one.
    pub fn all(&self, keep: &Keep) -> Vec<VolumePoint> {
        let mut v = self.points.clone();
        if keep.fold > 1 {
            v.extend(self.folded(keep));
        }
        v
    }
}

/// One point standing for consecutive interval points: counts added, mean latency and
/// outstanding IOs weighted exactly, max the max; p50 the IO-weighted median of the intervals'
/// p50s; p99 the 0.99 quantile of the mixture of the intervals' distributions, each taken as
/// log-linear between its p50 (0.5), p99 (0.99) and max (1.0). A slow stretch inside the
/// window shows as it would in the merged histogram: 6% of the IOs at 20 ms move the p99 to
/// 20 ms, where a median of p99s would hide them.
pub fn fold(points: &[VolumePoint]) -> VolumePoint {
    let Some(last) = points.last() else {
        return VolumePoint::default();
    };
    let mut out = VolumePoint {
        t_ms: last.t_ms,
        ..Default::default()
    };
    let mut lat_weight = 0.0;
    let mut out_weight = 0.0;
    for p in points {
        out.len_ms += p.len_ms;
        for d in 0..2 {
            out.ios[d] += p.ios[d];
            out.bytes[d] += p.bytes[d];
            out.errors[d] += p.errors[d];
        }
        let n = (p.ios[0] + p.ios[1]) as f64;
        out.lat_mean_us += p.lat_mean_us * n;
        lat_weight += n;
        out.outstanding += p.outstanding * p.len_ms as f64;
        out_weight += p.len_ms as f64;
        out.lat_max_us = out.lat_max_us.max(p.lat_max_us);
    }
    if lat_weight > 0.0 {
        out.lat_mean_us /= lat_weight;
    }
    if out_weight > 0.0 {
        out.outstanding /= out_weight;
    }
    out.lat_p50_us = weighted_median(points);
    out.lat_p99_us = mixture_quantile(points, 0.99);
    out
}

fn ios(p: &VolumePoint) -> f64 {
    (p.ios[0] + p.ios[1]) as f64
}

fn weighted_median(points: &[VolumePoint]) -> f64 {
    let mut v: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| ios(p) > 0.0)
        .map(|p| (p.lat_p50_us, ios(p)))
        .collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let half = v.iter().map(|x| x.1).sum::<f64>() / 2.0;
    let mut acc = 0.0;
    for (x, w) in &v {
        acc += w;
        if acc >= half {
            return *x;
        }
    }
    v[v.len() - 1].0
}

/// One interval as the mixture sees it: its weight and the anchors of its distribution (p50 at
/// 0.5, p99 at 0.99, max at 1.0), with their logarithms taken once per fold rather than at
/// every step of the search: the search was most of the time it took to read a 12-hour run's
/// timeline back (docs/scale.md).
struct Anchors {
    ios: f64,
    x: [f64; 3],
    ln: [f64; 3],
}

const SHARES: [f64; 3] = [0.5, 0.99, 1.0];

impl Anchors {
    fn of(p: &VolumePoint) -> Self {
        let x = [p.lat_p50_us, p.lat_p99_us, p.lat_max_us];
        Anchors {
            ios: ios(p),
            x,
            ln: x.map(|x| x.max(1e-9).ln()),
        }
    }

    /// The share of the interval's IOs at or below `x` (`ln_x` its logarithm): linear from 0
    /// to the p50, then log-linear between the anchors.
    fn share_below(&self, x: f64, ln_x: f64) -> f64 {
        if x < self.x[0] {
            return SHARES[0] * (x / self.x[0].max(1e-9)).clamp(0.0, 1.0);
        }
        for i in 0..2 {
            let (x0, x1) = (self.x[i], self.x[i + 1]);
            if x < x1 {
                if x1 <= x0 {
                    return SHARES[i + 1];
                }
                let t = (ln_x - self.ln[i]) / (self.ln[i + 1] - self.ln[i]);
                return SHARES[i] + (SHARES[i + 1] - SHARES[i]) * t.clamp(0.0, 1.0);
            }
        }
        1.0
    }
}

fn mixture_quantile(points: &[VolumePoint], q: f64) -> f64 {
    let anchors: Vec<Anchors> = points
        .iter()
        .filter(|p| ios(p) > 0.0)
        .map(Anchors::of)
        .collect();
    let total: f64 = anchors.iter().map(|a| a.ios).sum();
    if total <= 0.0 {
        return 0.0;
    }
    let below = |x: f64| {
        let ln_x = x.max(1e-9).ln();
        anchors
            .iter()
            .map(|a| a.ios * a.share_below(x, ln_x))
            .sum::<f64>()
            / total
    };
    let max = points.iter().map(|p| p.lat_max_us).fold(0.0, f64::max);
    // Far finer than the f32 a point is stored as (data/points.bin) and than any plot shows.
    bisect(max, QUANTILE_PRECISION, |x| below(x) >= q)
}

/// The least x in [0, `hi`] at which `reached` holds (it holds from some point on), to a
/// relative `precision`. At most the 60 steps of an f64's last bit, which also ends the search
/// near zero, where `hi x precision` underflows.
fn bisect(mut hi: f64, precision: f64, reached: impl Fn(f64) -> bool) -> f64 {
    let mut lo = 0.0f64;
    for _ in 0..60 {
        if hi - lo <= hi * precision {
            break;
        }
        let mid = (lo + hi) / 2.0;
        if reached(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Relative precision of a folded point's p99: a search to the last bit of an f64 took 60 steps,
/// this one takes about 35.
const QUANTILE_PRECISION: f64 = 1e-9;

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(i: u64, ios: u64, p50: f64, p99: f64, max: f64) -> VolumePoint {
        VolumePoint {
            t_ms: (i + 1) * 1000,
            len_ms: 1000,
            ios: [ios, 0],
            bytes: [ios * 4096, 0],
            outstanding: 4.0,
            lat_mean_us: p50,
            lat_p50_us: p50,
            lat_p99_us: p99,
            lat_max_us: max,
            ..Default::default()
        }
    }

    #[test]
    fn the_budget_decides_the_fold() {
        assert_eq!(fold_for(60, 4), 1);
        assert_eq!(fold_for(3_600, 8_000), 8);
        assert_eq!(fold_for(43_200, 8_000), 87);
        assert_eq!(recent_for(8), 120);
        assert_eq!(recent_for(80_000), 30);
    }

    #[test]
    fn counts_add_exactly_and_a_slow_stretch_moves_the_p99() {
        let mut pts: Vec<_> = (0..10)
            .map(|i| pt(i, 3000, 500.0, 1500.0, 3000.0))
            .collect();
        // One interval of ten where the volume is throttled: 180 IOs at 20 ms.
        pts[9] = pt(9, 180, 20_000.0, 25_000.0, 30_000.0);
        let f = fold(&pts);
        assert_eq!(f.ios[0], 9 * 3000 + 180);
        assert_eq!(f.len_ms, 10_000);
        assert_eq!(f.t_ms, 10_000);
        assert_eq!(f.lat_max_us, 30_000.0);
        assert_eq!(f.lat_p50_us, 500.0);
        // 180 of 27,180 IOs (0.66%) at 20 ms: the merged p99 stays with the fast intervals'
        // tail, above their own p99 but well below 20 ms.
        assert!(
            f.lat_p99_us > 1500.0 && f.lat_p99_us < 20_000.0,
            "{}",
            f.lat_p99_us
        );
        // Three throttled intervals (2% of IOs) put the p99 among the slow ones.
        for i in 7..10 {
            pts[i] = pt(i as u64, 180, 20_000.0, 25_000.0, 30_000.0);
        }
        let f = fold(&pts);
        assert!(f.lat_p99_us >= 19_000.0, "{}", f.lat_p99_us);
    }

    /// The search as first written, one logarithm per point and step, to the last bit: the
    /// reference of the faster search.
    fn reference_quantile(points: &[VolumePoint], q: f64) -> f64 {
        let share_below = |p: &VolumePoint, x: f64| {
            let anchors = [
                (p.lat_p50_us, 0.5),
                (p.lat_p99_us, 0.99),
                (p.lat_max_us, 1.0),
            ];
            if x < anchors[0].0 {
                return 0.5 * (x / anchors[0].0.max(1e-9)).clamp(0.0, 1.0);
            }
            for w in anchors.windows(2) {
                let ((x0, q0), (x1, q1)) = (w[0], w[1]);
                if x < x1 {
                    if x1 <= x0 {
                        return q1;
                    }
                    let l = |v: f64| v.max(1e-9).ln();
                    let t = (l(x) - l(x0)) / (l(x1) - l(x0));
                    return q0 + (q1 - q0) * t.clamp(0.0, 1.0);
                }
            }
            1.0
        };
        let total: f64 = points.iter().map(ios).sum();
        if total <= 0.0 {
            return 0.0;
        }
        let below = |x: f64| {
            points
                .iter()
                .map(|p| ios(p) * share_below(p, x))
                .sum::<f64>()
                / total
        };
        let max = points.iter().map(|p| p.lat_max_us).fold(0.0, f64::max);
        // Precision 0: all 60 steps, to the last bit, as first written.
        bisect(max, 0.0, |x| below(x) >= q)
    }

    proptest::proptest! {
        /// Taking the logarithms once per fold and stopping at [`QUANTILE_PRECISION`] move no
        /// folded p99 by more than that precision.
        #[test]
        fn the_mixture_quantile_equals_its_reference(
            pts in proptest::collection::vec(
                (0u64..5_000, 1.0f64..100_000.0, 1.0f64..10.0, 1.0f64..10.0), 1..100),
            q in 0.01f64..0.999,
        ) {
            let points: Vec<VolumePoint> = pts
                .iter()
                .enumerate()
                .map(|(i, &(n, p50, a, b))| pt(i as u64, n, p50, p50 * a, p50 * a * b))
                .collect();
            let (fast, slow) = (mixture_quantile(&points, q), reference_quantile(&points, q));
            let off = (fast - slow).abs() / slow.max(f64::MIN_POSITIVE);
            proptest::prop_assert!(off <= 2.0 * QUANTILE_PRECISION, "{} vs {}", fast, slow);
        }
    }

    #[test]
    fn kept_points_fold_by_slot_and_recent_stays_bounded() {
        let keep = Keep {
            interval_ms: 1000,
            fold: 10,
            recent: 5,
            in_memory: true,
        };
        let mut k = KeptPoints::default();
        for i in (0..25).filter(|&i| i != 19) {
            k.push(i, pt(i, 10, 100.0, 200.0, 300.0), &keep);
        }
        assert_eq!(k.points.len(), 2);
        assert_eq!(k.points[1].t_ms, 20_000, "a slot ends where it ends");
        assert_eq!(k.points[1].ios[0], 90);
        let all = k.all(&keep);
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].ios[0], 50);
        assert_eq!(all[2].t_ms, 30_000);
        assert_eq!(k.recent.len(), 5);
        assert_eq!(k.recent.back().unwrap().t_ms, 25_000);
        let mut one = KeptPoints::default();
        let keep = Keep::for_run(1000, 60, 4);
        for i in 0..3 {
            one.push(i, pt(i, 10, 100.0, 200.0, 300.0), &keep);
        }
        assert_eq!(one.points.len(), 3);
    }
}
