//! How small the data files' histograms could be, against what they are (a benchmark, not a
//! test): for volumes doing `--ios` IOs per direction and interval, the bytes per
//! volume-interval stored by `results/store` (zstd level 1, one frame per agent report and in
//! 64 KiB frames) and the floor no lossless format can go under.
//!
//! `cargo run --release -p lockstep --example disk_floor -- [--ios 100,250,500,1000,2000,4000]
//!  [--digits 2|3]`
//!
//! The floor: an interval's IOs are independent draws from the volume's latency distribution,
//! so the count in each histogram bucket is Poisson with mean `n x p_i`, and an interval's
//! histogram holds at least the sum of those Poisson entropies, even for a coder that knew
//! the distribution exactly (here `p_i` from 4 million draws of the same lognormal the
//! benchmark histograms come from, support/histograms.rs). Any real coder has to learn the
//! distribution too, so it stays above the floor.

#[path = "support/histograms.rs"]
mod support;

use hdrhistogram::Histogram;
use lockstep::results::store::ReportBlock;
use lockstep_proto::v1::VolumeInterval;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// Entropy (bits) of a Poisson count with mean `lambda`.
fn poisson_entropy(lambda: f64) -> f64 {
    if lambda <= 0.0 {
        return 0.0;
    }
    if lambda > 200.0 {
        // Normal approximation, within 0.1% there.
        return 0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E * lambda).log2();
    }
    let (mut p, mut h) = ((-lambda).exp(), 0.0);
    let top = (lambda * 4.0 + 40.0) as u64;
    for k in 0..=top {
        if p > 0.0 {
            h -= p * p.log2();
        }
        p *= lambda / (k + 1) as f64;
    }
    h
}

/// Each bucket's probability under the benchmark's latency model at `digits`.
fn bucket_probabilities(digits: u8) -> Vec<f64> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
    let lat = LogNormal::new((500_000f64).ln(), 0.6).unwrap();
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, digits).unwrap();
    let draws = 4_000_000u64;
    for _ in 0..draws {
        h.record((lat.sample(&mut rng) as u64).max(1)).unwrap();
    }
    h.iter_recorded()
        .map(|b| b.count_at_value() as f64 / draws as f64)
        .collect()
}

/// Stored bytes per volume-interval of `intervals` as agent reports of 8 volumes, compressed
/// with zstd level 1 in frames of at least `frame` raw bytes (0: one frame per report).
fn stored(intervals: &[VolumeInterval], frame: usize) -> f64 {
    let mut c = zstd::bulk::Compressor::new(1).unwrap();
    let (mut raw, mut out) = (Vec::new(), 0usize);
    for (r, report) in intervals.chunks(8).enumerate() {
        let first = (r * 8) as u32;
        let mut block = ReportBlock::new(0, 1000, first, report.len() as u32);
        for (v, vi) in report.iter().enumerate() {
            block.add(first + v as u32, vi);
        }
        raw.extend_from_slice(&block.records);
        if raw.len() >= frame {
            out += c.compress(&raw).unwrap().len();
            raw.clear();
        }
    }
    if !raw.is_empty() {
        out += c.compress(&raw).unwrap().len();
    }
    out as f64 / intervals.len() as f64
}

fn main() {
    let digits: u8 = arg("--digits", "2").parse().expect("--digits 2 or 3");
    let rates: Vec<u64> = arg("--ios", "100,250,500,1000,2000,4000")
        .split(',')
        .map(|s| {
            s.parse()
                .expect("--ios: IOs per direction, comma-separated")
        })
        .collect();
    let p = bucket_probabilities(digits);
    // The point record beside the histograms (store/format.rs).
    let point = 64.0;
    let mb_per_hour = |b: f64| (b + point) * 3600.0 / 1e6;
    println!(
        "IOs/dir  | per report B | 64 KiB frames B | floor B | MB per volume-hour (report / frames / floor), with the {point:.0} B point"
    );
    for ios in rates {
        let intervals = support::volume_intervals(1024, 3, ios, digits);
        let floor: f64 = intervals
            .iter()
            .flat_map(|vi| [&vi.read, &vi.write])
            .flatten()
            .map(|d| {
                p.iter()
                    .map(|pi| poisson_entropy(d.ios as f64 * pi))
                    .sum::<f64>()
                    / 8.0
            })
            .sum::<f64>()
            / intervals.len() as f64;
        let (one, framed) = (stored(&intervals, 0), stored(&intervals, 64 << 10));
        println!(
            "{ios:8} | {one:12.0} | {framed:15.0} | {floor:7.0} | {:.2} / {:.2} / {:.2}",
            mb_per_hour(one),
            mb_per_hour(framed),
            mb_per_hour(floor)
        );
    }
}
