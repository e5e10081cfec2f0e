//! The cluster's per-interval figures over a run, in memory that does not grow with the run.
//!
//! The last [`OPEN_INTERVALS`] intervals are open: every volume's latencies add to their dense
//! counts. Older ones are closed into a [`Closed`] record (counts and three percentiles, 64
//! bytes) in a `Vec` sorted by interval. A run whose points are folded (results/keeper.rs: one
//! point per `fold` intervals past 4 million points) folds its cluster intervals the same way,
//! with their latency counts added, so a folded point's percentiles are exact and a 12-hour run
//! keeps a few thousand records instead of 43,200 (2.6 MiB, which had been most of what grew
//! in a 100 x 8 run's memory after its first minute; results.json's cluster timeline shrinks
//! alike). The `BTreeMap` of whole interval structs this replaced cost about 260 bytes an
//! interval.

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
    /// The longest report's length; for a folded record, its intervals' lengths added (an
    /// interval of 49 days saturates it).
    pub len_ms: u32,
    /// Volumes that reported; for a folded record, the most of any of its intervals.
    pub volumes: u32,
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
}

impl Sums {
    fn add(&mut self, len_ms: u64, counters: [u64; 3]) {
        self.len_ms = self.len_ms.max(u32::try_from(len_ms).unwrap_or(u32::MAX));
        self.volumes += 1;
        self.add_counts(counters);
    }

    fn add_counts(&mut self, [ios, bytes, errors]: [u64; 3]) {
        self.ios += ios;
        self.bytes += bytes;
        self.errors += errors;
    }

    /// Adds a following interval of the same folded record.
    fn follow(&mut self, next: &Sums) {
        self.len_ms = self.len_ms.saturating_add(next.len_ms);
        self.volumes = self.volumes.max(next.volumes);
        self.add_counts([next.ios, next.bytes, next.errors]);
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

/// A closed interval, or `fold` of them: its counts and its p50, p99 and p99.9 at closing (64
/// bytes). `index` is the interval's, divided by the fold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    pub index: u64,
    pub sums: Sums,
    pub q: [u64; 3],
}

/// An open interval, or the folded record being filled: its latency counts are still dense,
/// so a late volume or the next interval still adds to them.
#[derive(Debug, Default, Clone)]
struct Open {
    sums: Sums,
    lat: DenseCounts,
}

impl Open {
    /// Its point, ending at `t_ms`, with the percentiles of its counts so far.
    fn point(&self, t_ms: u64) -> ClusterPoint {
        self.sums.point(t_ms, self.lat.quantiles(CLUSTER_QS))
    }

    /// Its record once closed as `index`: the counts dropped, the percentiles kept.
    fn closed(&self, index: u64) -> Closed {
        Closed {
            index,
            sums: self.sums,
            q: self.lat.quantiles(CLUSTER_QS),
        }
    }
}

/// The closed records, and the folded one still taking closed intervals.
#[derive(Debug, Clone)]
struct Closing {
    fold: u64,
    /// Sorted by index; each index at most once.
    closed: Vec<Closed>,
    /// The folded record being filled, with its index (fold > 1 only).
    filling: Option<(u64, Open)>,
}

impl Closing {
    fn find(&self, key: u64) -> Result<usize, usize> {
        self.closed.binary_search_by_key(&key, |c| c.index)
    }

    /// Keeps `c` in index order (in order already, except an interval reopened by a late
    /// report).
    fn keep(&mut self, c: Closed) {
        match self.closed.last() {
            Some(last) if last.index > c.index => {
                let at = self.find(c.index).unwrap_or_else(|at| at);
                self.closed.insert(at, c);
            }
            _ => self.closed.push(c),
        }
    }

    /// Interval `index` closes with `open`'s figures.
    fn close(&mut self, index: u64, open: Open) -> Result<(), HistogramCodecError> {
        let key = index / self.fold;
        if self.fold <= 1 {
            self.keep(open.closed(key));
            return Ok(());
        }
        match &mut self.filling {
            Some((k, f)) if *k == key => {
                f.sums.follow(&open.sums);
                f.lat.absorb(&open.lat)?;
            }
            // An interval nobody had reported, reopened by a late report after the records
            // around it were filled.
            Some((k, _)) if key < *k => match self.find(key) {
                Ok(at) => self.closed[at].sums.follow(&open.sums),
                Err(_) => self.keep(open.closed(key)),
            },
            _ => {
                self.flush();
                self.filling = Some((key, open));
            }
        }
        Ok(())
    }

    /// Closes the record being filled.
    fn flush(&mut self) {
        if let Some((index, f)) = self.filling.take() {
            self.keep(f.closed(index));
        }
    }

    /// Adds a late report's counts to the closed record of interval `index`, if there is one.
    fn add_late(&mut self, index: u64, len_ms: u64, counters: [u64; 3]) -> bool {
        let key = index / self.fold;
        if self.fold > 1 {
            // Its interval already counted in the record's length and volumes.
            let filling = self.filling.as_mut().filter(|(k, _)| *k == key);
            if let Some((_, f)) = filling {
                f.sums.add_counts(counters);
                return true;
            }
        }
        let Ok(at) = self.find(key) else { return false };
        let sums = &mut self.closed[at].sums;
        if self.fold > 1 {
            sums.add_counts(counters);
        } else {
            sums.add(len_ms, counters);
        }
        true
    }
}

/// The cluster's intervals of one run.
#[derive(Debug)]
pub struct ClusterIntervals {
    interval_ms: u64,
    open: BTreeMap<u64, Open>,
    closing: Closing,
    newest: Option<u64>,
    /// Intervals below this index are closed (or close at the next `close_behind`).
    closed_below: u64,
}

impl ClusterIntervals {
    pub fn new(interval_ms: u64) -> Self {
        ClusterIntervals {
            interval_ms,
            open: BTreeMap::new(),
            closing: Closing {
                fold: 1,
                closed: Vec::new(),
                filling: None,
            },
            newest: None,
            closed_below: 0,
        }
    }

    /// Folds `fold` intervals into each closed record and point (before any report arrives).
    pub fn folded(mut self, fold: u64) -> Self {
        self.closing.fold = fold.max(1);
        self
    }

    fn t_ms(&self, index: u64) -> u64 {
        (index + 1) * self.interval_ms
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
        if index < self.closed_below && self.closing.add_late(index, len_ms, counters) {
            return add_lat(None);
        }
        let open = self.open.entry(index).or_default();
        open.sums.add(len_ms, counters);
        add_lat(Some(&mut open.lat))
    }

    /// Interval `index` arrived: closes those `OPEN_INTERVALS` or more behind it, when it is the
    /// newest so far.
    pub fn close_behind(&mut self, index: u64) -> Result<(), HistogramCodecError> {
        if self.newest.is_some_and(|n| index <= n) {
            return Ok(());
        }
        self.newest = Some(index);
        let below = index.saturating_sub(OPEN_INTERVALS - 1);
        while let Some(entry) = self.open.first_entry()
            && *entry.key() < below
        {
            let (index, open) = entry.remove_entry();
            self.closing.close(index, open)?;
        }
        self.closed_below = self.closed_below.max(below);
        Ok(())
    }

    /// The cluster at interval `index`, from whatever volumes reported it so far: its folded
    /// record's once it closed into one.
    pub fn point(&self, index: u64) -> Option<ClusterPoint> {
        if let Some(o) = self.open.get(&index) {
            return Some(o.point(self.t_ms(index)));
        }
        let c = &self.closing;
        let key = index / c.fold;
        let end = (key + 1) * c.fold * self.interval_ms;
        if let Some((_, f)) = c.filling.as_ref().filter(|(k, _)| *k == key) {
            return Some(f.point(end));
        }
        let r = &c.closed[c.find(key).ok()?];
        Some(r.sums.point(end, r.q))
    }

    /// The newest interval any volume reported.
    pub fn latest_index(&self) -> Option<u64> {
        self.newest.max(self.open.keys().next_back().copied())
    }

    /// Every interval's point, in interval order (one per `fold` intervals).
    pub fn points(&self) -> Result<Vec<ClusterPoint>, HistogramCodecError> {
        let fold = self.closing.fold;
        if fold <= 1 {
            return Ok(self.points_unfolded());
        }
        // The open intervals fold into a copy, as they would have closed.
        let mut all = self.closing.clone();
        for (&i, o) in &self.open {
            all.close(i, o.clone())?;
        }
        all.flush();
        let end = |c: &Closed| (c.index + 1) * fold * self.interval_ms;
        Ok(all
            .closed
            .iter()
            .map(|c| c.sums.point(end(c), c.q))
            .collect())
    }

    fn points_unfolded(&self) -> Vec<ClusterPoint> {
        let closed = &self.closing.closed;
        let mut out = Vec::with_capacity(closed.len() + self.open.len());
        let mut open = self.open.iter().peekable();
        for c in closed {
            while let Some((&i, o)) = open.next_if(|&(&i, _)| i < c.index) {
                out.push(o.point(self.t_ms(i)));
            }
            out.push(c.sums.point(self.t_ms(c.index), c.q));
        }
        for (&i, o) in open {
            out.push(o.point(self.t_ms(i)));
        }
        out
    }

    /// How many records are closed and intervals open.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        (self.closing.closed.len(), self.open.len())
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
        c.close_behind(index).unwrap();
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
        let p = c.points().unwrap();
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
        assert_eq!(c.points().unwrap()[..39], p[..]);
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
        let all = c.points().unwrap();
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
        assert_eq!(c.points().unwrap().len(), 6);
    }

    #[test]
    fn a_folded_point_adds_its_intervals_and_takes_their_merged_percentiles() {
        let fold = 4;
        let mut c = ClusterIntervals::new(1000).folded(fold);
        let mut exact = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        // Intervals 0..4: two volumes each; interval 2 slow.
        for i in 0..4u64 {
            let lat = if i == 2 {
                40_000_000
            } else {
                1_000_000 + i * 1000
            };
            for _ in 0..2 {
                add(&mut c, i, &[lat; 25]);
                exact.record_n(lat, 25).unwrap();
            }
        }
        // Intervals 4..30 one volume each, so the first record closes.
        for i in 4..30 {
            add(&mut c, i, &[2_000_000]);
        }
        let p = c.point(1).unwrap();
        assert_eq!(c.point(3), Some(p));
        assert_eq!(p.t_ms, 4000);
        assert_eq!((p.iops, p.volumes), (50.0, 2));
        let us = |q: f64| exact.value_at_quantile(q) as f64 / 1000.0;
        assert_eq!(p.lat_p50_us, us(0.5));
        assert_eq!(p.lat_p99_us, us(0.99));
        assert_eq!(p.lat_p99_us, 40_009.727);
        // 30 intervals are 8 records (the last partial, ending where its record ends).
        let all = c.points().unwrap();
        assert_eq!(all.len(), 8);
        assert_eq!(all[0], p);
        assert_eq!(all[7].t_ms, 32_000);
        assert!((all[7].iops - 1.0).abs() < 1e-9);
        assert!(c.counts().0 <= 8);
        // A late report adds its counts to its record, not its latencies or its length.
        assert!(!add(&mut c, 1, &[900_000_000; 50]));
        let late = c.point(1).unwrap();
        assert_eq!(
            (late.iops, late.volumes, late.lat_p99_us),
            (62.5, 2, p.lat_p99_us)
        );
        // Into the record still filling, the same.
        let filling = c.point(16).unwrap();
        assert!(!add(&mut c, 16, &[1_000_000; 4]));
        assert_eq!(c.point(17).unwrap().iops, filling.iops + 1.0);
    }

    #[test]
    fn a_folded_run_keeps_records_not_intervals() {
        let mut c = ClusterIntervals::new(1000).folded(9);
        for i in 0..9_000 {
            add(&mut c, i, &[1_000_000]);
        }
        // 8,990 intervals closed: 998 records, and the 999th filling.
        assert_eq!(c.counts(), (998, OPEN_INTERVALS as usize));
        let all = c.points().unwrap();
        assert_eq!(all.len(), 1000);
        assert!(
            all.iter()
                .all(|p| (p.iops - 1.0).abs() < 1e-9 && p.volumes == 1)
        );
        assert!(all.windows(2).all(|w| w[1].t_ms - w[0].t_ms == 9000));
    }

    #[test]
    fn an_interval_reopened_after_its_neighbours_were_folded_gets_a_record() {
        let mut c = ClusterIntervals::new(1000).folded(3);
        // Intervals 3, 4 and 5 (record 1) never reported, until late.
        for i in (0..40).filter(|i| !(3..6).contains(i)) {
            add(&mut c, i, &[1_000_000]);
        }
        assert_eq!(c.point(4), None);
        assert!(add(&mut c, 4, &[5_000_000]));
        assert!(add(&mut c, 5, &[5_000_000]));
        add(&mut c, 40, &[1_000_000]);
        let p = c.point(3).unwrap();
        assert_eq!(
            (p.t_ms, p.iops, p.volumes, p.lat_p50_us),
            (6000, 1.0, 1, 5_001.215)
        );
        let all = c.points().unwrap();
        assert_eq!(all.len(), 14);
        assert!(all.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert_eq!(all[1], p);
    }
}
