//! Token buckets, and the `iops_cap` / `bw_cap` gates built from them.
//!
//! A bucket fills at `rate` tokens per second up to `capacity`; an IO of cost `c` is admitted
//! once the level reaches `min(c, capacity)` and is then charged in full. So over any window of
//! length `W` a bucket admits at most `rate × W + capacity` tokens of IOs no larger than its
//! capacity (the classic bound; tested below), and a larger IO drives the level negative (debt)
//! that later IOs wait out, so the long-run rate still holds for huge IOs (fio `bs=128M`).
//! Debt also absorbs the one case the two-step `admit`/`charge` protocol cannot rule out: several
//! clones sharing one gate being admitted at the same instant.
//!
//! Everything is O(1) per IO: a bucket keeps its level at the last charge and extrapolates.

use super::spec::{BwCapSpec, IopsCapSpec};
use super::{Admission, IoGate};
use crate::job::Direction;

const NS_PER_S: f64 = 1e9;

/// Slack for float rounding when comparing a level with a cost (tokens are IOs or bytes, so a
/// millionth of one is far below anything observable).
const EPS: f64 = 1e-6;

/// How much a ceiling (a hard IOPS or byte rate) lets through at once: this much time's worth of
/// tokens. Real throttles smooth over a short period too, and without some slack a runner that
/// oversleeps by 100 µs would lose those tokens and undershoot the ceiling.
pub const CEILING_BURST_S: f64 = 0.010;

/// A token bucket on a clock of ns since the origin.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    rate_per_s: f64,
    capacity: f64,
    /// Level at `last_ns`; negative while paying off a large IO.
    level: f64,
    last_ns: u64,
}

impl TokenBucket {
    /// A bucket holding `initial` tokens (clamped to `capacity`) at `start_ns`.
    pub fn new(rate_per_s: f64, capacity: f64, initial: f64, start_ns: u64) -> Self {
        let rate_per_s = if rate_per_s.is_finite() {
            rate_per_s.max(0.0)
        } else {
            0.0
        };
        let capacity = if capacity.is_finite() {
            capacity.max(0.0)
        } else {
            0.0
        };
        TokenBucket {
            rate_per_s,
            capacity,
            level: initial.clamp(0.0, capacity),
            last_ns: start_ns,
        }
    }

    /// A full ceiling bucket: `rate_per_s` sustained, `CEILING_BURST_S` of it at once, and never
    /// less than `min_burst` (one IO, so a low ceiling still admits whole IOs without debt).
    pub fn ceiling(rate_per_s: f64, min_burst: f64, start_ns: u64) -> Self {
        let capacity = (rate_per_s * CEILING_BURST_S).max(min_burst);
        TokenBucket::new(rate_per_s, capacity, capacity, start_ns)
    }

    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }

    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The level at `now_ns` if nothing is charged meanwhile (instants before the last charge
    /// see the level at the last charge: clones sharing a gate have slightly skewed clocks).
    pub fn level_at(&self, now_ns: u64) -> f64 {
        if now_ns <= self.last_ns {
            return self.level;
        }
        let dt = (now_ns - self.last_ns) as f64 / NS_PER_S;
        (self.level + self.rate_per_s * dt).min(self.capacity)
    }

    /// The earliest instant ≥ `now_ns` at which an IO of `cost` tokens may go.
    pub fn admit_at(&self, now_ns: u64, cost: f64) -> u64 {
        let need = cost.min(self.capacity);
        let level = self.level_at(now_ns);
        if level + EPS >= need {
            return now_ns;
        }
        if self.rate_per_s <= 0.0 {
            return u64::MAX;
        }
        let base = now_ns.max(self.last_ns);
        // Rounded up, so the level at the returned instant is at least `need`.
        let wait_ns = ((need - level) / self.rate_per_s * NS_PER_S).ceil();
        base.saturating_add(wait_ns as u64)
    }

    /// Takes `cost` tokens at `now_ns` (the level may go negative: see the module doc).
    pub fn charge(&mut self, now_ns: u64, cost: f64) {
        if now_ns > self.last_ns {
            self.level = self.level_at(now_ns);
            self.last_ns = now_ns;
        }
        self.level -= cost;
    }
}

/// What a cap counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapUnit {
    /// Every IO counts 1 whatever its size (cgroup `riops`/`wiops`).
    Ios,
    /// Bytes (cgroup `rbps`/`wbps`).
    Bytes,
}

/// The least burst of a byte cap: one 4 KiB page, so small IOs pass whole even at tiny rates.
const MIN_BYTES_BURST: f64 = 4096.0;

/// An `iops_cap` or `bw_cap`: per-direction ceilings plus one on the sum; an IO must pass the
/// bucket of its direction and the total one.
#[derive(Debug, Clone, PartialEq)]
pub struct CapGate {
    unit: CapUnit,
    /// Indexed by `Direction as usize`, then the total at 2.
    buckets: [Option<TokenBucket>; 3],
}

impl CapGate {
    pub fn new(
        unit: CapUnit,
        read: Option<u64>,
        write: Option<u64>,
        total: Option<u64>,
        start_ns: u64,
    ) -> Self {
        let min_burst = match unit {
            CapUnit::Ios => 1.0,
            CapUnit::Bytes => MIN_BYTES_BURST,
        };
        let mk =
            |rate: Option<u64>| rate.map(|r| TokenBucket::ceiling(r as f64, min_burst, start_ns));
        CapGate {
            unit,
            buckets: [mk(read), mk(write), mk(total)],
        }
    }

    pub fn iops(spec: &IopsCapSpec, start_ns: u64) -> Self {
        CapGate::new(CapUnit::Ios, spec.read, spec.write, spec.total, start_ns)
    }

    pub fn bandwidth(spec: &BwCapSpec, start_ns: u64) -> Self {
        CapGate::new(
            CapUnit::Bytes,
            spec.read_bytes_per_s,
            spec.write_bytes_per_s,
            spec.total_bytes_per_s,
            start_ns,
        )
    }

    fn cost(&self, len: u64) -> f64 {
        match self.unit {
            CapUnit::Ios => 1.0,
            CapUnit::Bytes => len as f64,
        }
    }

    fn relevant(&mut self, dir: Direction) -> impl Iterator<Item = &mut TokenBucket> {
        let [r, w, t] = &mut self.buckets;
        let d = match dir {
            Direction::Read => r,
            Direction::Write => w,
        };
        d.as_mut().into_iter().chain(t.as_mut())
    }
}

impl IoGate for CapGate {
    fn admit(&mut self, now_ns: u64, dir: Direction, len: u64) -> Admission {
        let cost = self.cost(len);
        let t = self
            .relevant(dir)
            .map(|b| b.admit_at(now_ns, cost))
            .max()
            .unwrap_or(now_ns);
        if t <= now_ns {
            Admission::Now
        } else {
            Admission::At(t)
        }
    }

    fn charge(&mut self, now_ns: u64, dir: Direction, len: u64) {
        let cost = self.cost(len);
        for b in self.relevant(dir) {
            b.charge(now_ns, cost);
        }
    }
}

/// Drives a gate the way the runner does: each IO is intended at `intended_ns` (non-decreasing),
/// waits for admission, and is charged at the admitted instant. Returns the issue instants.
/// Public because the agent's gate tests (`agent/src/fault/build.rs`) drive gates the same way.
pub fn drive(
    gate: &mut dyn IoGate,
    ios: impl IntoIterator<Item = (u64, Direction, u64)>,
) -> Vec<u64> {
    let mut clock = 0u64;
    let mut out = Vec::new();
    for (intended, dir, len) in ios {
        let now = clock.max(intended);
        let t = match gate.admit(now, dir, len) {
            Admission::Now => now,
            Admission::At(t) => {
                assert!(t > now, "At must be in the future");
                t
            }
        };
        gate.charge(t, dir, len);
        clock = t;
        out.push(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The largest cost admitted in any window [t_i, t_j] of issue instants, against the bound.
    fn check_window_bound(times: &[u64], costs: &[f64], rate: f64, burst: f64) {
        for i in 0..times.len() {
            let mut sum = 0.0;
            for j in i..times.len() {
                sum += costs[j];
                let w = (times[j] - times[i]) as f64 / NS_PER_S;
                let bound = rate * w + burst;
                assert!(
                    sum <= bound + 1e-6 * bound.max(1.0),
                    "window {i}..={j}: admitted {sum} > rate*W + burst = {bound}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The token bucket's promise: over any window W, at most rate × W + capacity.
        #[test]
        fn bucket_never_exceeds_rate_times_window_plus_burst(
            rate in 1.0f64..100_000.0,
            capacity in 1.0f64..1_000.0,
            ios in prop::collection::vec((0u64..2_000_000, 0.0f64..1.0), 1..150),
        ) {
            let mut b = TokenBucket::new(rate, capacity, capacity, 0);
            let mut clock = 0u64;
            let (mut times, mut costs) = (Vec::new(), Vec::new());
            for (gap, frac) in ios {
                let cost = (frac * capacity).max(1e-3);
                let now = clock + gap;
                let t = b.admit_at(now, cost);
                prop_assert!(t >= now);
                b.charge(t, cost);
                clock = t;
                times.push(t);
                costs.push(cost);
            }
            check_window_bound(&times, &costs, rate, capacity);
        }

        /// IOs larger than the bucket go into debt: the bound grows by one IO, no more.
        #[test]
        fn debt_keeps_the_long_run_rate(
            rate in 1_000.0f64..1_000_000.0,
            lens in prop::collection::vec(1u64..(1 << 20), 1..120),
        ) {
            let mut gate = CapGate::new(CapUnit::Bytes, None, None, Some(rate as u64), 0);
            let rate = rate as u64 as f64;
            let capacity = (rate * CEILING_BURST_S).max(MIN_BYTES_BURST);
            let ios: Vec<_> = lens.iter().map(|&l| (0, Direction::Write, l)).collect();
            let times = drive(&mut gate, ios);
            let costs: Vec<f64> = lens.iter().map(|&l| l as f64).collect();
            let max_cost = costs.iter().cloned().fold(0.0, f64::max);
            check_window_bound(&times, &costs, rate, capacity + max_cost);
        }

        /// Per-direction caps hold separately, and the total cap holds for the sum.
        #[test]
        fn iops_cap_holds_per_direction_and_total(
            read in 10u64..5_000, write in 10u64..5_000, total in 10u64..5_000,
            dirs in prop::collection::vec(any::<bool>(), 1..200),
        ) {
            let spec = IopsCapSpec { read: Some(read), write: Some(write), total: Some(total) };
            let mut gate = CapGate::iops(&spec, 0);
            let ios: Vec<_> = dirs.iter()
                .map(|&r| (0, if r { Direction::Read } else { Direction::Write }, 4096))
                .collect();
            let times = drive(&mut gate, ios);
            let burst = |r: u64| (r as f64 * CEILING_BURST_S).max(1.0);
            check_window_bound(&times, &vec![1.0; times.len()], total as f64, burst(total));
            for (want_read, rate) in [(true, read), (false, write)] {
                let t: Vec<u64> = times.iter().zip(&dirs).filter(|(_, r)| **r == want_read).map(|(t, _)| *t).collect();
                check_window_bound(&t, &vec![1.0; t.len()], rate as f64, burst(rate));
            }
        }
    }

    #[test]
    fn a_saturated_cap_runs_at_its_rate() {
        let spec = IopsCapSpec {
            read: None,
            write: None,
            total: Some(1_000),
        };
        let mut gate = CapGate::iops(&spec, 0);
        let times = drive(&mut gate, (0..5_000).map(|_| (0, Direction::Read, 4096)));
        // 10 IOs of burst at once, then one per ms.
        let in_first_s = times.iter().filter(|&&t| t < 1_000_000_000).count();
        assert!((1_000..=1_011).contains(&in_first_s), "{in_first_s}");
        let last = *times.last().unwrap() as f64 / NS_PER_S;
        assert!((last - 4.99).abs() < 0.002, "{last}");
    }

    #[test]
    fn a_cap_on_one_direction_leaves_the_other_alone() {
        let spec = BwCapSpec {
            write_bytes_per_s: Some(1 << 20),
            ..Default::default()
        };
        let mut gate = CapGate::bandwidth(&spec, 0);
        for _ in 0..1_000 {
            assert_eq!(gate.admit(0, Direction::Read, 1 << 20), Admission::Now);
            gate.charge(0, Direction::Read, 1 << 20);
        }
        gate.charge(0, Direction::Write, 1 << 20);
        assert!(matches!(
            gate.admit(0, Direction::Write, 4096),
            Admission::At(_)
        ));
    }

    #[test]
    fn level_refills_to_capacity_and_no_further() {
        let mut b = TokenBucket::new(100.0, 50.0, 50.0, 0);
        b.charge(0, 50.0);
        assert_eq!(b.level_at(0), 0.0);
        assert!((b.level_at(250_000_000) - 25.0).abs() < 1e-9);
        assert_eq!(b.level_at(10_000_000_000), 50.0);
        // Admission of 30 tokens from empty: 0.3 s.
        assert_eq!(b.admit_at(0, 30.0), 300_000_000);
        // Earlier instants than the last charge do not refill.
        b.charge(1_000_000_000, 0.0);
        assert_eq!(b.level_at(500_000_000), 50.0);
    }

    #[test]
    fn a_zero_rate_bucket_never_admits_once_empty() {
        let mut b = TokenBucket::new(0.0, 1.0, 1.0, 0);
        assert_eq!(b.admit_at(5, 1.0), 5);
        b.charge(5, 1.0);
        assert_eq!(b.admit_at(10, 1.0), u64::MAX);
    }
}
