//! The cluster's per-interval figures over a run, in memory that does not grow with the run
//! beyond 64 bytes an interval.
//!
//! The last [`OPEN_INTERVALS`] intervals are open: every volume's latencies add to their dense
//! counts. Older ones are closed into a [`Closed`] record (counts and three percentiles) in a
//! `Vec` sorted by interval: a 12-hour run keeps 43,200 x 64 bytes = 2.6 MiB. The
//! `BTreeMap` of whole interval structs this replaces cost about 260 bytes an interval (a
//! closed interval kept its emptied dense counts, and map nodes are partly empty).

use std::collections::BTreeMap;

use lockstep_proto::histogram::HistogramCodecError;

use crate::results::ClusterPoint;
use crate::results::counts::DenseCounts;

/// Intervals this far behind the newest are closed: their latency counts are dropped and only
/// their figures kept, so a 12-hour run does not keep 43,200 histograms. Ten intervals leave
/// room for agents that report late (a slow link, a replay after a short cut-off) while the
/// open ones hold at most 10 x 270 KiB.
pub const OPEN_INTERVALS: u64 = 10;

const CLUSTER_QS: [f64; 3] = [0.5, 0.99, 0.999];

/// What every volume's report adds to its interval, open or closed: exact counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sums {
    /// The longest report's length (an interval of 49 days saturates it).
    pub len_ms: u32,
    pub volumes: u32,
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
}

impl Sums {
    fn add(&mut self, len_ms: u64, [ios, bytes, errors]: [u64; 3]) {
        self.len_ms = self.len_ms.max(u32::try_from(len_ms).unwrap_or(u32::MAX));
        self.volumes += 1;
        self.ios += ios;
        self.bytes += bytes;
        self.errors += errors;
    }

    fn point(&self, t_ms: u64, q: [u64; 3]) -> ClusterPoint {
        let secs = self.len_ms.max(1) as f64 / 1000.0;
        let us = |ns: u64| ns as f64 / 1000.0;
        ClusterPoint {
            t_ms,
            iops: self.ios as f64 / secs,
            bytes_per_sec: self.bytes as f64 / secs,
            errors: self.errors,
            lat_p50_us: us(q[0]),
            lat_p99_us: us(q[1]),
            lat_p999_us: us(q[2]),
            volumes: self.volumes,
        }
    }
}

/// A closed interval: its counts and its p50, p99 and p99.9 at closing (64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    pub index: u64,
    pub sums: Sums,
    pub q: [u64; 3],
}

/// An open interval: its latency counts are still dense, so a late volume still adds to them.
#[derive(Debug, Default)]
struct Open {
    sums: Sums,
    lat: DenseCounts,
}

/// The cluster's intervals of one run.
#[derive(Debug)]
pub struct ClusterIntervals {
    interval_ms: u64,
    open: BTreeMap<u64, Open>,
    /// Sorted by index; each index at most once.
    closed: Vec<Closed>,
    newest: Option<u64>,
    /// Intervals below this index are closed (or close at the next `close_behind`).
    closed_below: u64,
}

impl ClusterIntervals {
    pub fn new(interval_ms: u64) -> Self {
        ClusterIntervals {
            interval_ms,
            open: BTreeMap::new(),
            closed: Vec::new(),
            newest: None,
            closed_below: 0,
        }
    }

    fn t_ms(&self, index: u64) -> u64 {
        (index + 1) * self.interval_ms
    }

    fn find_closed(&self, index: u64) -> Result<usize, usize> {
        self.closed.binary_search_by_key(&index, |c| c.index)
    }

    /// Adds one volume's counters (`[ios, bytes, errors]`) to interval `index`, and its judged
    /// latencies through `add_lat` while the interval is open. A report after its interval
    /// closed (an agent more than `OPEN_INTERVALS` behind) adds its counts but not its
    /// latencies: the percentiles stay those computed at closing (the volume's and the run's
    /// figures include them exactly). A late report for an interval that nobody reported
    /// opens it until the next interval closes others.
    pub fn add<T>(
        &mut self,
        index: u64,
        len_ms: u64,
        counters: [u64; 3],
        add_lat: impl FnOnce(Option<&mut DenseCounts>) -> Result<T, HistogramCodecError>,
    ) -> Result<T, HistogramCodecError> {
        if index < self.closed_below
            && let Ok(at) = self.find_closed(index)
        {
            self.closed[at].sums.add(len_ms, counters);
            return add_lat(None);
        }
        let open = self.open.entry(index).or_default();
        open.sums.add(len_ms, counters);
        add_lat(Some(&mut open.lat))
    }

    /// Interval `index` arrived: closes those `OPEN_INTERVALS` or more behind it, when it is the
    /// newest so far.
    pub fn close_behind(&mut self, index: u64) {
        if self.newest.is_some_and(|n| index <= n) {
            return;
        }
        self.newest = Some(index);
        let below = index.saturating_sub(OPEN_INTERVALS - 1);
        while let Some(entry) = self.open.first_entry()
            && *entry.key() < below
        {
            let (index, open) = entry.remove_entry();
            let c = Closed {
                index,
                sums: open.sums,
                q: open.lat.quantiles(CLUSTER_QS),
            };
            // In order, except an interval reopened by a late report.
            match self.closed.last() {
                Some(last) if last.index > index => {
                    let at = self.find_closed(index).unwrap_or_else(|at| at);
                    self.closed.insert(at, c);
                }
                _ => self.closed.push(c),
            }
        }
        self.closed_below = self.closed_below.max(below);
    }

    /// The cluster at interval `index`, from whatever volumes reported it so far.
    pub fn point(&self, index: u64) -> Option<ClusterPoint> {
        if let Some(o) = self.open.get(&index) {
            return Some(o.sums.point(self.t_ms(index), o.lat.quantiles(CLUSTER_QS)));
        }
        let c = &self.closed[self.find_closed(index).ok()?];
        Some(c.sums.point(self.t_ms(index), c.q))
    }

    /// The newest interval any volume reported.
    pub fn latest_index(&self) -> Option<u64> {
        let open = self.open.keys().next_back().copied();
        let closed = self.closed.last().map(|c| c.index);
        open.max(closed)
    }

    /// Every interval's point, in interval order.
    pub fn points(&self) -> Vec<ClusterPoint> {
        let mut out = Vec::with_capacity(self.closed.len() + self.open.len());
        let mut open = self.open.iter().peekable();
        for c in &self.closed {
            while let Some((&i, o)) = open.next_if(|&(&i, _)| i < c.index) {
                out.push(o.sums.point(self.t_ms(i), o.lat.quantiles(CLUSTER_QS)));
            }
            out.push(c.sums.point(self.t_ms(c.index), c.q));
        }
        for (&i, o) in open {
            out.push(o.sums.point(self.t_ms(i), o.lat.quantiles(CLUSTER_QS)));
        }
        out
    }

    /// How many intervals are closed and open.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        (self.closed.len(), self.open.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;
    use lockstep_proto::histogram::{BucketDecoder, encode};

    /// Adds one volume's report of `lat` (ns) at `index`: 1 IO of 4 KiB per latency.
    fn add(c: &mut ClusterIntervals, index: u64, lat: &[u64]) -> bool {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for &v in lat {
            h.record(v).unwrap();
        }
        let mut buckets = Vec::new();
        let (g, _) = BucketDecoder::default()
            .decode(&encode(&h).unwrap(), &mut buckets)
            .unwrap();
        let n = lat.len() as u64;
        let open = c
            .add(index, 1000, [n, n * 4096, 0], |d| {
                Ok(d.map(|d| d.add(g, &buckets)).is_some())
            })
            .unwrap();
        c.close_behind(index);
        open
    }

    #[test]
    fn a_closed_interval_is_64_bytes() {
        assert_eq!(std::mem::size_of::<Closed>(), 64);
    }

    #[test]
    fn closing_keeps_the_figures_and_the_order() {
        let mut c = ClusterIntervals::new(1000);
        // Interval 5 has no report: no point, as before.
        for i in (0..40).filter(|&i| i != 5) {
            assert!(add(&mut c, i, &[1_000_000 + i * 1000, 2_000_000]));
        }
        let open_before = c.point(39).unwrap();
        assert_eq!(c.counts(), (39 - OPEN_INTERVALS as usize, 10));
        assert_eq!(c.latest_index(), Some(39));
        assert_eq!(c.point(5), None);
        let p = c.points();
        assert_eq!(p.len(), 39);
        assert!(p.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert_eq!(p[0].t_ms, 1000);
        assert_eq!(p[5].t_ms, 7000);
        assert_eq!(p[5].lat_p50_us, 1006.079);
        assert_eq!(p[5].iops, 2.0);
        // Closing does not change a point.
        for i in 40..60 {
            add(&mut c, i, &[1_000_000]);
        }
        assert_eq!(c.point(39), Some(open_before));
        assert_eq!(c.points()[..39], p[..]);
    }

    #[test]
    fn a_late_report_adds_its_counts_and_only_an_open_interval_takes_its_latencies() {
        let mut c = ClusterIntervals::new(1000);
        for i in 0..30 {
            add(&mut c, i, &[1_000_000]);
        }
        let before = c.point(3).unwrap();
        assert!(!add(&mut c, 3, &[500_000_000]));
        let after = c.point(3).unwrap();
        assert_eq!((after.iops, after.volumes), (2.0, 2));
        assert_eq!(after.lat_p999_us, before.lat_p999_us);
        assert!(add(&mut c, 25, &[500_000_000]));
        assert_eq!(c.point(25).unwrap().lat_p999_us, 500_170.751);
        // An interval nobody reported opens for its late report, and closes at the next new
        // interval, in its place.
        let mut c = ClusterIntervals::new(1000);
        for i in (0..30).filter(|&i| i != 7) {
            add(&mut c, i, &[1_000_000]);
        }
        assert!(add(&mut c, 7, &[3_000_000]));
        assert!(add(&mut c, 7, &[3_000_000]));
        add(&mut c, 30, &[1_000_000]);
        assert!(!add(&mut c, 7, &[3_000_000]));
        let p = c.point(7).unwrap();
        assert_eq!((p.volumes, p.lat_p50_us), (3, 3000.319));
        let all = c.points();
        assert_eq!(all.len(), 31);
        assert!(all.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert_eq!(all[7], p);
    }

    #[test]
    fn a_far_jump_closes_everything_without_room_for_the_gap() {
        let mut c = ClusterIntervals::new(1000);
        for i in 0..5 {
            add(&mut c, i, &[1_000_000]);
        }
        add(&mut c, u64::MAX / 2000, &[1_000_000]);
        assert_eq!(c.counts(), (5, 1));
        assert_eq!(c.points().len(), 6);
    }
}
