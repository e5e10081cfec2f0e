//! Latency counts accumulated in place: the merge's accumulators.
//!
//! Pure: bucket lists in, counts and exact figures out. A volume's run total receives one
//! interval histogram per second for the whole run; keeping it as a sorted bucket list (the
//! `SparseHistogram`) made each interval a walk over the total's thousands of buckets plus a
//! copy, and the biggest item in the merge profile. `PagedCounts` adds an interval in time
//! proportional to the interval's own buckets: the counts are dense in pages of 128 buckets
//! (512 bytes), allocated only where a volume's latencies fall, so a volume whose latencies
//! span 70 us to 4 ms (6,000 buckets at 3 significant digits) holds about 24 KiB per direction
//! (the sorted list took 16 bytes per bucket in use). Counts are u32 in the pages; the rare
//! count beyond (a null-engine volume at a million IOPS for hours, all in a few buckets) keeps
//! its upper part in `high`, so totals stay exact.

use std::collections::BTreeMap;

use lockstep_proto::histogram::{Geometry, HistogramCodecError, SparseHistogram};

const PAGE: usize = 128;
/// How many buckets ahead `PagedCounts` slots are fetched.
const PREFETCH_AHEAD: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct PagedCounts {
    geometry: Option<Geometry>,
    /// Page `i` holds buckets `i * PAGE ..`; `None` until a count falls there.
    pages: Vec<Option<Box<[u32; PAGE]>>>,
    /// Bucket index -> what its count holds beyond the u32 in its page.
    high: BTreeMap<u32, u64>,
    total: u64,
}

impl PagedCounts {
    /// Whether any histogram was added (even an empty one): a direction's `lat_intended` is
    /// reported only for the volumes that sent one.
    pub fn is_set(&self) -> bool {
        self.geometry.is_some()
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Adds a histogram given as sorted (index, count) pairs with indexes within `geometry`
    /// (what `BucketDecoder` produces). Exact, like HdrHistogram's `add` on equal geometry.
    pub fn add(
        &mut self,
        geometry: Geometry,
        buckets: &[(u32, u64)],
    ) -> Result<(), HistogramCodecError> {
        self.prepare(geometry, buckets)?;
        for (j, &(i, c)) in buckets.iter().enumerate() {
            if let Some(&(ahead, _)) = buckets.get(j + PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            self.add_one(i, c);
            self.total += c;
        }
        Ok(())
    }

    /// Checks the geometry and makes room for `buckets`, so `add_one` can take them.
    fn prepare(
        &mut self,
        geometry: Geometry,
        buckets: &[(u32, u64)],
    ) -> Result<(), HistogramCodecError> {
        match self.geometry {
            Some(g) if g != geometry && self.total > 0 => {
                return Err(HistogramCodecError::Decode(format!(
                    "cannot merge histograms of different precision ({g:?} vs {geometry:?})"
                )));
            }
            Some(g) if g == geometry => {}
            _ => {
                self.geometry = Some(geometry);
                self.pages.clear();
                self.high.clear();
            }
        }
        if let Some(&(last, _)) = buckets.last() {
            let need = last as usize / PAGE + 1;
            if self.pages.len() < need {
                self.pages.resize_with(need, || None);
            }
        }
        Ok(())
    }

    /// Adds one bucket's count; the caller adds to `total`, once per histogram, so the loop
    /// keeps the sum in a register.
    #[inline(always)]
    fn add_one(&mut self, i: u32, c: u64) {
        let page = self.pages[i as usize / PAGE].get_or_insert_with(|| Box::new([0; PAGE]));
        let slot = &mut page[i as usize % PAGE];
        let sum = u64::from(*slot) + c;
        *slot = sum as u32;
        if sum > u64::from(u32::MAX) {
            *self.high.entry(i).or_default() += sum - u64::from(sum as u32);
        }
    }

    /// Asks the CPU to fetch bucket `i`'s slot now. A volume's total is touched once per
    /// interval, so its slots are out of cache every time; fetching some buckets ahead lets
    /// the misses overlap instead of stalling the add one after the other (add_one was a third
    /// of the merge, nearly all of it waiting on the slot's load).
    #[inline(always)]
    fn prefetch(&self, i: u32) {
        #[cfg(target_arch = "x86_64")]
        if let Some(Some(page)) = self.pages.get(i as usize / PAGE) {
            let p = page[i as usize % PAGE..].as_ptr().cast::<i8>();
            // SAFETY: a prefetch is a hint with no effect on memory; `p` points into the page.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
            }
        }
    }

    /// The non-zero buckets in index order.
    fn buckets(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for (p, page) in self.pages.iter().enumerate() {
            let Some(page) = page else { continue };
            for (k, &c) in page.iter().enumerate() {
                if c > 0 {
                    out.push(((p * PAGE + k) as u32, u64::from(c)));
                }
            }
        }
        // A slot at 0 may still hold a count in `high` (a multiple of 2^32).
        if !self.high.is_empty() {
            let mut all: BTreeMap<u32, u64> = out.into_iter().collect();
            for (&i, &h) in &self.high {
                *all.entry(i).or_default() += h;
            }
            out = all.into_iter().collect();
        }
        out
    }

    pub fn to_sparse(&self) -> Option<SparseHistogram> {
        let g = self.geometry?;
        Some(SparseHistogram::from_sorted(g, self.buckets()))
    }
}

/// Quantiles, mean and max of the union of two sorted bucket lists of one geometry, without
/// building it: a volume's point is the union of its read and write latencies. Equal to
/// `SparseHistogram::union_stats` (tested). Walking the two lists together, as `union_stats`
/// does, branches on which list comes next at every bucket, which no predictor guesses on
/// interleaved read and write latencies: it was a fifth of the merge. Here each list is taken
/// once (`take`), into prefix sums and an exact integer sum for the mean, and each quantile is
/// then a binary search over the prefix sums.
#[derive(Debug, Default)]
pub struct Union2 {
    prefix: [Vec<u64>; 2],
    sum: [u128; 2],
    last: [Option<u32>; 2],
}

impl Union2 {
    /// Takes `list` as part `k` (0 or 1) of the union, and adds its counts to `paged` and
    /// `dense` in the same pass: a volume's run total is cold in cache when its next interval
    /// arrives, and the pass waits on it anyway.
    pub fn take(
        &mut self,
        k: usize,
        g: Geometry,
        list: &[(u32, u64)],
        mut paged: Option<&mut PagedCounts>,
        mut dense: Option<&mut DenseCounts>,
    ) -> Result<(), HistogramCodecError> {
        if let Some(p) = paged.as_deref_mut() {
            p.prepare(g, list)?;
        }
        if let Some(d) = dense.as_deref_mut() {
            d.prepare(g, list)?;
        }
        let prefix = &mut self.prefix[k];
        prefix.clear();
        prefix.reserve(list.len());
        let (mut acc, mut sum) = (0u64, 0u128);
        for (j, &(i, c)) in list.iter().enumerate() {
            acc += c;
            prefix.push(acc);
            sum += u128::from(g.median_equivalent(i)) * u128::from(c);
            if let Some(p) = paged.as_deref_mut() {
                if let Some(&(ahead, _)) = list.get(j + PREFETCH_AHEAD) {
                    p.prefetch(ahead);
                }
                p.add_one(i, c);
            }
            if let Some(d) = dense.as_deref_mut() {
                d.counts[i as usize] += c;
            }
        }
        if let Some(p) = paged {
            p.total += acc;
        }
        if let Some(d) = dense {
            d.total += acc;
        }
        self.sum[k] = sum;
        self.last[k] = list.last().map(|&(i, _)| i);
        Ok(())
    }

    /// Part `k` is empty.
    pub fn clear(&mut self, k: usize) {
        self.prefix[k].clear();
        self.sum[k] = 0;
        self.last[k] = None;
    }

    /// The figures of the two parts taken, `lists` being those same lists.
    pub fn figures<const N: usize>(
        &self,
        g: Geometry,
        lists: [&[(u32, u64)]; 2],
        qs: [f64; N],
    ) -> UnionFigures<N> {
        let total = self
            .prefix
            .iter()
            .map(|p| p.last().copied().unwrap_or(0))
            .sum::<u64>();
        let mut out = UnionFigures {
            quantiles: [0; N],
            mean: 0.0,
            max: 0,
        };
        if total == 0 {
            return out;
        }
        for (k, &q) in qs.iter().enumerate() {
            let target = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
            let at = self.index_at(lists, target, total);
            out.quantiles[k] = if q == 0.0 {
                g.lowest_equivalent(at)
            } else {
                g.highest_equivalent(at)
            };
        }
        out.max = self
            .last
            .iter()
            .flatten()
            .max()
            .map_or(0, |&i| g.highest_equivalent(i));
        out.mean = ((self.sum[0] + self.sum[1]) as f64) / total as f64;
        out
    }

    /// The smallest bucket index at which the union's cumulative count reaches `target`
    /// (1 <= target <= total). A high quantile (p99) lies among the last few buckets, so it
    /// is found walking down from the top of both lists, a handful of steps; a low one by a
    /// binary search over each list's prefix sums (for each list, the first of its buckets
    /// where the union's count reaches the target). The nested binary searches had been 8% of
    /// the coordinator's run loop at 1,000 agents, most of it for p99.
    fn index_at(&self, lists: [&[(u32, u64)]; 2], target: u64, total: u64) -> u32 {
        if target > total / 2 {
            return Self::index_from_top(lists, total - target);
        }
        let cum = |idx: u32| -> u64 {
            lists
                .iter()
                .zip(&self.prefix)
                .map(|(l, p)| match l.partition_point(|&(i, _)| i <= idx) {
                    0 => 0,
                    n => p[n - 1],
                })
                .sum()
        };
        lists
            .iter()
            .filter_map(|l| {
                let n = l.partition_point(|&(i, _)| cum(i) < target);
                l.get(n).map(|&(i, _)| i)
            })
            .min()
            .expect("target within the total")
    }

    /// The lowest bucket index with at most `above` counts in higher buckets: walks the two
    /// lists down together from their last buckets until the counts passed exceed `above`.
    fn index_from_top(lists: [&[(u32, u64)]; 2], above: u64) -> u32 {
        let [mut a, mut b] = lists.map(|l| l.iter().rev().peekable());
        let (mut passed, mut lowest) = (0u64, 0u32);
        loop {
            let idx = match (a.peek(), b.peek()) {
                (Some(&&(i, _)), Some(&&(j, _))) => i.max(j),
                (Some(&&(i, _)), None) | (None, Some(&&(i, _))) => i,
                // Only when `above` is not below the lists' total, which `figures` rules out.
                (None, None) => return lowest,
            };
            lowest = idx;
            let here: u64 = [&mut a, &mut b]
                .into_iter()
                .filter_map(|l| l.next_if(|&&(i, _)| i == idx).map(|&(_, c)| c))
                .sum();
            passed += here;
            if passed > above {
                return idx;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnionFigures<const N: usize> {
    pub quantiles: [u64; N],
    pub mean: f64,
    pub max: u64,
}

/// Dense counts (indexed like HdrHistogram's) of one geometry: the cluster's open intervals,
/// which every volume adds to, so an add is a pass over the volume's buckets only.
#[derive(Debug, Clone, Default)]
pub struct DenseCounts {
    geometry: Option<Geometry>,
    counts: Vec<u64>,
    total: u64,
}

impl DenseCounts {
    pub fn add(
        &mut self,
        geometry: Geometry,
        buckets: &[(u32, u64)],
    ) -> Result<(), HistogramCodecError> {
        self.prepare(geometry, buckets)?;
        for &(i, c) in buckets {
            self.counts[i as usize] += c;
            self.total += c;
        }
        Ok(())
    }

    fn same_geometry(&mut self, geometry: Geometry) -> Result<(), HistogramCodecError> {
        match self.geometry {
            Some(g) if g != geometry => Err(HistogramCodecError::Decode(format!(
                "cannot merge histograms of different precision ({g:?} vs {geometry:?})"
            ))),
            _ => {
                self.geometry = Some(geometry);
                Ok(())
            }
        }
    }

    fn prepare(
        &mut self,
        geometry: Geometry,
        buckets: &[(u32, u64)],
    ) -> Result<(), HistogramCodecError> {
        self.same_geometry(geometry)?;
        if let Some(&(last, _)) = buckets.last()
            && self.counts.len() <= last as usize
        {
            self.counts.resize(last as usize + 1, 0);
        }
        Ok(())
    }

    /// Adds every count of `other` (of the same geometry): a folded cluster point's counts
    /// are its intervals' counts added, so its percentiles are exact.
    pub fn absorb(&mut self, other: &DenseCounts) -> Result<(), HistogramCodecError> {
        let Some(g) = other.geometry else {
            return Ok(());
        };
        self.same_geometry(g)?;
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, &c) in self.counts.iter_mut().zip(&other.counts) {
            *mine += c;
        }
        self.total += other.total;
        Ok(())
    }

    /// HdrHistogram's `value_at_quantile` for each of `qs` (ascending), 0 when empty.
    pub fn quantiles<const N: usize>(&self, qs: [f64; N]) -> [u64; N] {
        let mut out = [0; N];
        let Some(g) = self.geometry.filter(|_| self.total > 0) else {
            return out;
        };
        let targets = qs.map(|q| ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1));
        let (mut acc, mut next) = (0u64, 0);
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            acc += c;
            while next < N && acc >= targets[next] {
                out[next] = if qs[next] == 0.0 {
                    g.lowest_equivalent(i as u32)
                } else {
                    g.highest_equivalent(i as u32)
                };
                next += 1;
            }
            if next == N {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::Histogram;
    use lockstep_proto::histogram::{BucketDecoder, encode};
    use proptest::prelude::*;

    fn dense(values: &[(u64, u64)]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for &(v, n) in values {
            h.record_n(v, n).unwrap();
        }
        h
    }

    fn buckets(h: &Histogram<u64>) -> (Geometry, Vec<(u32, u64)>) {
        let mut out = Vec::new();
        let (g, _) = BucketDecoder::default()
            .decode(&encode(h).unwrap(), &mut out)
            .unwrap();
        (g, out)
    }

    const QS: [f64; 8] = [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0];

    proptest! {
        /// Accumulated counts give exactly HdrHistogram's figures on the same data.
        #[test]
        fn paged_and_dense_counts_match_hdrhistogram(
            intervals in prop::collection::vec(
                prop::collection::vec((1u64..20_000_000_000u64, 1u64..1000), 0..200), 1..6),
        ) {
            let mut all = dense(&[]);
            let mut paged = PagedCounts::default();
            let mut cluster = DenseCounts::default();
            for iv in &intervals {
                let h = dense(iv);
                let (g, b) = buckets(&h);
                paged.add(g, &b).unwrap();
                cluster.add(g, &b).unwrap();
                all.add(&h).unwrap();
            }
            let s = paged.to_sparse().unwrap();
            prop_assert_eq!(s.len(), all.len());
            prop_assert_eq!(paged.total(), all.len());
            for q in QS {
                prop_assert_eq!(s.value_at_quantile(q), all.value_at_quantile(q), "q={}", q);
            }
            prop_assert_eq!(s.max(), all.max());
            prop_assert_eq!(s.min(), all.min());
            if !all.is_empty() {
                prop_assert_eq!(cluster.quantiles(QS).to_vec(),
                    QS.iter().map(|&q| all.value_at_quantile(q)).collect::<Vec<_>>());
            }
        }

        /// The two-list search gives what `union_stats` gives.
        #[test]
        fn union2_equals_union_stats(
            a in prop::collection::vec((1u64..5_000_000_000u64, 1u64..50), 0..300),
            b in prop::collection::vec((1u64..50_000_000u64, 1u64..50), 0..300),
        ) {
            let (g, ba) = buckets(&dense(&a));
            let (_, bb) = buckets(&dense(&b));
            let mut u = Union2::default();
            let (mut p, mut d) = (PagedCounts::default(), DenseCounts::default());
            u.take(0, g, &ba, Some(&mut p), Some(&mut d)).unwrap();
            u.take(1, g, &bb, Some(&mut p), None).unwrap();
            prop_assert_eq!(p.total(), d.total + bb.iter().map(|&(_, c)| c).sum::<u64>());
            // Low quantiles take the binary search, high ones the walk from the top.
            let qs = [0.0, 0.25, 0.5, 0.51, 0.9, 0.99, 0.999, 1.0];
            let u = u.figures(g, [&ba, &bb], qs);
            let sa = SparseHistogram::from_sorted(g, ba);
            let sb = SparseHistogram::from_sorted(g, bb);
            let want = SparseHistogram::union_stats(&[&sa, &sb], &qs);
            prop_assert_eq!(u.quantiles.to_vec(), want.quantiles);
            prop_assert_eq!(u.max, want.max);
            let close = (u.mean - want.mean).abs() <= want.mean * 1e-12;
            prop_assert!(close, "{} {}", u.mean, want.mean);
        }
    }

    #[test]
    fn counts_beyond_u32_stay_exact() {
        let h = dense(&[(1_000_000, 3_000_000_000), (2_000, 7)]);
        let (g, b) = buckets(&h);
        let mut p = PagedCounts::default();
        for _ in 0..5 {
            p.add(g, &b).unwrap();
        }
        let s = p.to_sparse().unwrap();
        assert_eq!(s.len(), 5 * 3_000_000_007);
        assert_eq!(s.buckets(), &[(b[0].0, 35), (b[1].0, 15_000_000_000)][..]);
    }

    #[test]
    fn different_precisions_are_refused() {
        let mut other = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 2).unwrap();
        other.record(1000).unwrap();
        let (g2, b2) = buckets(&other);
        let (g, b) = buckets(&dense(&[(1000, 1)]));
        let mut p = PagedCounts::default();
        p.add(g, &b).unwrap();
        assert!(p.add(g2, &b2).is_err());
        let mut d = DenseCounts::default();
        d.add(g, &b).unwrap();
        assert!(d.add(g2, &b2).is_err());
    }
}
