//! Pre-encoded interval histograms for simulated volumes.
//!
//! Encoding a histogram costs tens of microseconds (HdrHistogram V2 + deflate); 10,000
//! simulated agents of 8 volumes would need 160,000 of them a second, more than the whole
//! machine the coordinator is measured on. So each simulator draws its intervals from a pool
//! made once at start-up, encoded with the real agent's `lockstep_proto::histogram::encode`
//! (a codec change shows up here too). Pure: a seed in, the same pool out.

use hdrhistogram::Histogram;
use lockstep_core::stats::{latency_histogram, record};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use rand_xoshiro::Xoshiro256PlusPlus;

/// How a pool's latencies are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyModel {
    /// Median latency (ns): a lognormal's median is `exp(mu)`.
    pub median_ns: f64,
    /// Lognormal shape: 0.35 puts p99 at about 2.3x the median, like a healthy SSD volume.
    pub sigma: f64,
    /// IOs per interval, drawn uniformly from this range (inclusive).
    pub ios: (u64, u64),
}

impl LatencyModel {
    /// The same volume 1.5x (or `factor`x) slower: latencies scale, and a closed loop at the
    /// same depth completes `1/factor` as many IOs.
    pub fn slower(self, factor: f64) -> Self {
        LatencyModel {
            median_ns: self.median_ns * factor,
            sigma: self.sigma,
            ios: (
                (self.ios.0 as f64 / factor) as u64,
                (self.ios.1 as f64 / factor) as u64,
            ),
        }
    }
}

/// One pre-made interval of one direction.
#[derive(Debug, Clone)]
pub struct PoolEntry {
    pub ios: u64,
    /// Mean latency (ns), for the interval's Little's-law outstanding IOs.
    pub mean_ns: f64,
    /// The encoded histogram, as it goes on the wire (3 significant digits, as recorded).
    pub encoded: Vec<u8>,
    /// The same coarsened to 2 digits, as an agent sends it under `histogram_digits = 2`
    /// (`lockstep_proto::histogram::encode_at`, the agent's own function).
    pub encoded_2: Vec<u8>,
    /// The recorded values as (slot in the pool's `values`, count), to rebuild a whole-run
    /// total exactly.
    pub recorded: Vec<(u32, u64)>,
}

/// A pool of intervals drawn from one latency model.
#[derive(Debug, Clone)]
pub struct Pool {
    pub entries: Vec<PoolEntry>,
    /// Every value any entry recorded, sorted: a total is summed in an array of these slots
    /// and recorded once per slot. Recording every entry's values into the histogram took
    /// 7.8 ms per agent of 8 volumes after 300 intervals, 78 s of the simulator's CPU at the
    /// end of a 10,000-agent run, while the coordinator waited for the final results.
    pub values: Vec<u64>,
}

impl Pool {
    /// `size` intervals (at least 1) drawn with `seed`.
    pub fn generate(model: LatencyModel, size: usize, seed: u64) -> Pool {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let dist = LogNormal::new(model.median_ns.ln(), model.sigma)
            .expect("a positive median and a finite sigma make a lognormal");
        let (lo, hi) = (model.ios.0.max(1), model.ios.1.max(model.ios.0.max(1)));
        let drawn: Vec<Histogram<u64>> = (0..size.max(1))
            .map(|_| {
                let ios = rng.random_range(lo..=hi);
                let mut h = latency_histogram();
                for _ in 0..ios {
                    record(&mut h, dist.sample(&mut rng) as u64);
                }
                h
            })
            .collect();
        let mut values: Vec<u64> = drawn
            .iter()
            .flat_map(|h| h.iter_recorded().map(|v| v.value_iterated_to()))
            .collect();
        values.sort_unstable();
        values.dedup();
        let entries = drawn.iter().map(|h| entry(h, &values)).collect();
        Pool { entries, values }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The whole-run histogram of a volume that used entry `e` `uses[e]` times: exactly the
    /// sum of the intervals it streamed, so its final result agrees with them.
    pub fn total(&self, uses: &[u32]) -> Histogram<u64> {
        let mut h = latency_histogram();
        self.add_total(&mut h, uses);
        h
    }

    /// Adds `total(uses)` to `h` in place: a final result sums two pools per direction, and a
    /// histogram of the whole latency range built and added per pool doubled the cost of the
    /// simulator's end of run, when every agent of the process builds its final at once.
    pub fn add_total(&self, h: &mut Histogram<u64>, uses: &[u32]) {
        let mut sum = vec![0u64; self.values.len()];
        for (e, &n) in self.entries.iter().zip(uses) {
            if n == 0 {
                continue;
            }
            for &(slot, c) in &e.recorded {
                sum[slot as usize] += c * u64::from(n);
            }
        }
        for (&v, &c) in self.values.iter().zip(&sum) {
            if c > 0 {
                // Cannot fail: every value came from a histogram of the same bounds.
                let _ = h.record_n(v, c);
            }
        }
    }
}

fn entry(h: &Histogram<u64>, values: &[u64]) -> PoolEntry {
    PoolEntry {
        ios: h.len(),
        mean_ns: h.mean(),
        encoded: lockstep_proto::histogram::encode(h).expect("a valid histogram encodes"),
        encoded_2: lockstep_proto::histogram::encode_at(h, 2).expect("a valid histogram encodes"),
        recorded: h
            .iter_recorded()
            .map(|v| {
                let slot = values.partition_point(|&x| x < v.value_iterated_to());
                (slot as u32, v.count_at_value())
            })
            .collect(),
    }
}

impl PoolEntry {
    /// The encoding at `digits` significant digits (2 or 3).
    pub fn encoded_at(&self, digits: u8) -> &[u8] {
        if digits == 2 {
            &self.encoded_2
        } else {
            &self.encoded
        }
    }
}

/// Which pool entry a volume uses for an interval: a hash of (volume seed, interval index), so
/// volumes differ, the choice needs no state, and a replay gives the same answer.
pub fn pick(volume_seed: u64, index: u64, pool_len: usize) -> usize {
    let mut x = volume_seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64's finalizer: neighbouring indexes land far apart.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x % pool_len.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_proto::histogram::SparseHistogram;

    const MODEL: LatencyModel = LatencyModel {
        median_ns: 500_000.0,
        sigma: 0.35,
        ios: (1_000, 3_000),
    };

    #[test]
    fn a_pool_is_the_same_for_the_same_seed_and_decodes_to_what_was_drawn() {
        let a = Pool::generate(MODEL, 8, 7);
        let b = Pool::generate(MODEL, 8, 7);
        assert_eq!(a.len(), 8);
        for (x, y) in a.entries.iter().zip(&b.entries) {
            assert_eq!(x.encoded, y.encoded);
            assert!((1_000..=3_000).contains(&x.ios), "{}", x.ios);
            let h = SparseHistogram::decode(&x.encoded).unwrap();
            assert_eq!(h.len(), x.ios);
            let coarse = SparseHistogram::decode(x.encoded_at(2)).unwrap();
            assert_eq!((coarse.len(), coarse.geometry.sigfig), (x.ios, 2));
            assert!(coarse.buckets_in_use() < h.buckets_in_use());
            // Lognormal median 0.5 ms: the decoded median is close to it.
            let p50 = h.value_at_percentile(50.0) as f64;
            assert!((400_000.0..600_000.0).contains(&p50), "{p50}");
        }
        assert_ne!(
            a.entries[0].encoded,
            Pool::generate(MODEL, 8, 8).entries[0].encoded
        );
    }

    #[test]
    fn a_slower_model_has_its_median_scaled_and_fewer_ios() {
        let slow = Pool::generate(MODEL.slower(1.5), 4, 1);
        for e in &slow.entries {
            assert!((666..=2_000).contains(&e.ios), "{}", e.ios);
            let p50 = SparseHistogram::decode(&e.encoded)
                .unwrap()
                .value_at_percentile(50.0) as f64;
            assert!((650_000.0..850_000.0).contains(&p50), "{p50}");
        }
    }

    #[test]
    fn the_total_equals_the_merge_of_the_intervals_it_counts() {
        let pool = Pool::generate(MODEL, 5, 3);
        let uses = [2u32, 0, 1, 0, 3];
        let total = pool.total(&uses);
        let mut merged = latency_histogram();
        for (e, &n) in pool.entries.iter().zip(&uses) {
            let h = lockstep_proto::histogram::decode(&e.encoded)
                .unwrap()
                .unwrap();
            for _ in 0..n {
                merged.add(&h).unwrap();
            }
        }
        assert_eq!(total.len(), merged.len());
        for q in [0.5, 0.99, 0.999, 1.0] {
            assert_eq!(total.value_at_quantile(q), merged.value_at_quantile(q));
        }
    }

    #[test]
    fn picks_stay_in_the_pool_and_use_all_of_it() {
        let mut seen = [0u32; 16];
        for i in 0..1_000 {
            seen[pick(42, i, 16)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 20), "{seen:?}");
        assert_eq!(pick(42, 5, 16), pick(42, 5, 16));
    }
}
