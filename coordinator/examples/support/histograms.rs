//! Realistic interval histograms for the benchmarks: what an agent sends for one volume and one
//! interval, encoded as agents encode them. Latencies are lognormal around 0.5 ms (sigma 0.6:
//! p99 about 2 ms, a cloud SSD volume's spread), by default 1,500-2,500 IOs per direction.

use hdrhistogram::Histogram;
use lockstep_proto::histogram::encode_at;
use lockstep_proto::v1::{DirInterval, VolumeInterval};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

/// `n` distinct volume intervals with read and write histograms of `ios` IOs each (+-25%), to
/// reuse round robin (the cost of handling a histogram does not depend on whether it was seen
/// before). `digits`: the significant digits sent (2: coarsened as agents do under
/// `histogram_digits = 2`).
pub fn volume_intervals(n: usize, seed: u64, ios: u64, digits: u8) -> Vec<VolumeInterval> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    let lat = LogNormal::new((500_000f64).ln(), 0.6).unwrap();
    (0..n)
        .map(|_| {
            let mut dir = || {
                let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
                let n = ios * 3 / 4 + rng.random_range(0..ios.max(2) / 2);
                for _ in 0..n {
                    h.record((lat.sample(&mut rng) as u64).max(1)).unwrap();
                }
                DirInterval {
                    ios: n,
                    bytes: n * 8192,
                    errors: 0,
                    clat_hist: Vec::new(),
                    lat_hist: encode_at(&h, digits).unwrap(),
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
        .collect()
}

/// This process's resident memory now, MiB (from /proc). Not every example reports it.
#[allow(dead_code)]
pub fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}
