//! `IoFault`s: added latency, EIO, stalls and dropped writes, each drawing from its own seeded
//! RNG so a run is repeatable, and `FaultSet`, which applies several of them each only inside
//! its window.
//!
//! Each fault owns an independent xoshiro256++ stream (seeded from the run's seed and the
//! fault's position in the schedule), so the IOs an `eio` fault fails do not change when a
//! `latency` fault is added beside it.

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::spec::{Directions, DropWritesSpec, EioSpec, LatencyDistribution, LatencySpec, Window};
use super::{IoFault, Outcome};
use crate::job::Direction;

const NS_PER_US: u64 = 1_000;

/// The RNG of the fault at `index` of a schedule run with `seed`.
pub fn fault_rng(seed: u64, index: usize) -> Xoshiro256PlusPlus {
    // Xoshiro's seed_from_u64 runs SplitMix64, so nearby inputs give unrelated streams.
    Xoshiro256PlusPlus::seed_from_u64(seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// `true` with probability `fraction` (0 never, 1 always).
fn hit(rng: &mut Xoshiro256PlusPlus, fraction: f64) -> bool {
    rng.random::<f64>() < fraction
}

fn clamp_fraction(f: f64) -> f64 {
    if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) }
}

/// How a delay is drawn, in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Delay {
    Fixed(u64),
    Uniform { min_ns: u64, max_ns: u64 },
    Exponential { mean_ns: f64 },
}

/// Holds back the completion of a `fraction` of the IOs of a direction by a fixed or drawn delay
/// (from submission, as `Outcome::DelayBy` says).
#[derive(Debug, Clone)]
pub struct LatencyFault {
    delay: Delay,
    fraction: f64,
    direction: Directions,
    rng: Xoshiro256PlusPlus,
}

impl LatencyFault {
    pub fn new(spec: &LatencySpec, rng: Xoshiro256PlusPlus) -> Self {
        let delay = match (spec.add_us, spec.distribution) {
            (Some(us), _) => Delay::Fixed(us.saturating_mul(NS_PER_US)),
            (None, Some(LatencyDistribution::Uniform { min_us, max_us })) => Delay::Uniform {
                min_ns: min_us.saturating_mul(NS_PER_US),
                max_ns: max_us.max(min_us).saturating_mul(NS_PER_US),
            },
            (None, Some(LatencyDistribution::Exponential { mean_us })) => Delay::Exponential {
                mean_ns: mean_us as f64 * NS_PER_US as f64,
            },
            (None, None) => Delay::Fixed(0),
        };
        LatencyFault {
            delay,
            fraction: clamp_fraction(spec.fraction),
            direction: spec.direction,
            rng,
        }
    }

    fn draw(&mut self) -> u64 {
        match self.delay {
            Delay::Fixed(ns) => ns,
            Delay::Uniform { min_ns, max_ns } => self.rng.random_range(min_ns..=max_ns),
            Delay::Exponential { mean_ns } => {
                // Inverse CDF; 1 − u is in (0, 1], so the logarithm is finite.
                let u: f64 = self.rng.random();
                (-mean_ns * (1.0 - u).ln()) as u64
            }
        }
    }
}

impl IoFault for LatencyFault {
    fn on_issue(&mut self, _now_ns: u64, dir: Direction, _len: u64) -> Outcome {
        if !self.direction.matches(dir) || !hit(&mut self.rng, self.fraction) {
            return Outcome::Deliver;
        }
        Outcome::DelayBy(self.draw())
    }

    fn stalled_until(&self, _now_ns: u64) -> Option<u64> {
        None
    }
}

/// Fails a `fraction` of the IOs of a direction with EIO without touching the device.
#[derive(Debug, Clone)]
pub struct EioFault {
    fraction: f64,
    direction: Directions,
    rng: Xoshiro256PlusPlus,
}

impl EioFault {
    pub fn new(spec: &EioSpec, rng: Xoshiro256PlusPlus) -> Self {
        EioFault {
            fraction: clamp_fraction(spec.fraction),
            direction: spec.direction,
            rng,
        }
    }
}

impl IoFault for EioFault {
    fn on_issue(&mut self, _now_ns: u64, dir: Direction, _len: u64) -> Outcome {
        if self.direction.matches(dir) && hit(&mut self.rng, self.fraction) {
            Outcome::FailEio
        } else {
            Outcome::Deliver
        }
    }

    fn stalled_until(&self, _now_ns: u64) -> Option<u64> {
        None
    }
}

/// Acknowledges a `fraction` of writes without writing them (reads are untouched): the
/// lost-write verifier must find every one of them.
#[derive(Debug, Clone)]
pub struct DropWritesFault {
    fraction: f64,
    rng: Xoshiro256PlusPlus,
}

impl DropWritesFault {
    pub fn new(spec: &DropWritesSpec, rng: Xoshiro256PlusPlus) -> Self {
        DropWritesFault {
            fraction: clamp_fraction(spec.fraction),
            rng,
        }
    }
}

impl IoFault for DropWritesFault {
    fn on_issue(&mut self, _now_ns: u64, dir: Direction, _len: u64) -> Outcome {
        if dir == Direction::Write && hit(&mut self.rng, self.fraction) {
            Outcome::DropWrite
        } else {
            Outcome::Deliver
        }
    }

    fn stalled_until(&self, _now_ns: u64) -> Option<u64> {
        None
    }
}

/// No completions during `window`: any completion reaped inside it is held until its end. IOs
/// are still issued (the device works; the host just hears nothing), as in a path failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallFault {
    window: Window,
}

impl StallFault {
    pub fn new(window: Window) -> Self {
        StallFault { window }
    }
}

impl IoFault for StallFault {
    fn on_issue(&mut self, _now_ns: u64, _dir: Direction, _len: u64) -> Outcome {
        Outcome::Deliver
    }

    /// The window's end; `u64::MAX` for a stall that lasts to the end of the run (the runner's
    /// stop signal ends the wait).
    fn stalled_until(&self, now_ns: u64) -> Option<u64> {
        self.window.contains(now_ns).then_some(self.window.end_ns)
    }
}

/// Several faults, each consulted only inside its window.
///
/// When more than one fires on the same IO the strongest wins: EIO over a dropped write over
/// added latency; delays from several latency faults add up. Every active fault draws for every
/// IO it matches even when another already decided, so each one's share stays what it says.
#[derive(Default)]
pub struct FaultSet {
    entries: Vec<(Window, Box<dyn IoFault>)>,
}

impl FaultSet {
    pub fn new() -> Self {
        FaultSet::default()
    }

    pub fn push(&mut self, window: Window, fault: Box<dyn IoFault>) {
        self.entries.push((window, fault));
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

fn rank(o: Outcome) -> u8 {
    match o {
        Outcome::Deliver => 0,
        Outcome::DelayBy(_) => 1,
        Outcome::DropWrite => 2,
        Outcome::FailEio => 3,
    }
}

impl IoFault for FaultSet {
    fn on_issue(&mut self, now_ns: u64, dir: Direction, len: u64) -> Outcome {
        let mut out = Outcome::Deliver;
        for (window, fault) in &mut self.entries {
            if !window.contains(now_ns) {
                continue;
            }
            out = match (out, fault.on_issue(now_ns, dir, len)) {
                (Outcome::DelayBy(a), Outcome::DelayBy(b)) => Outcome::DelayBy(a.saturating_add(b)),
                (a, b) if rank(b) > rank(a) => b,
                (a, _) => a,
            };
        }
        out
    }

    /// The end of the stall covering `now_ns`, followed through stalls that begin exactly where
    /// the previous one ends (the runner waits once, so back-to-back stalls must be one wait).
    fn stalled_until(&self, now_ns: u64) -> Option<u64> {
        let mut until = None;
        let mut t = now_ns;
        // Each step moves to a later window end, so this ends within `entries.len()` steps.
        for _ in 0..=self.entries.len() {
            let next = self
                .entries
                .iter()
                .filter(|(w, _)| w.contains(t))
                .filter_map(|(_, f)| f.stalled_until(t))
                .max();
            match next {
                Some(end) if end > t => {
                    until = Some(end);
                    t = end;
                }
                _ => break,
            }
        }
        until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn eio(fraction: f64, direction: Directions, seed: u64) -> EioFault {
        EioFault::new(
            &EioSpec {
                fraction,
                direction,
            },
            fault_rng(seed, 0),
        )
    }

    fn outcomes(f: &mut dyn IoFault, n: usize, dir: Direction) -> Vec<Outcome> {
        (0..n)
            .map(|i| f.on_issue(i as u64 * 1_000, dir, 4096))
            .collect()
    }

    #[test]
    fn eio_fraction_is_within_statistical_bounds_and_repeatable() {
        let n = 100_000;
        for (seed, p) in [(1, 0.01), (2, 0.1), (3, 0.5)] {
            let got = outcomes(&mut eio(p, Directions::Both, seed), n, Direction::Read);
            let fails = got.iter().filter(|o| **o == Outcome::FailEio).count() as f64;
            // Binomial: mean n·p, sd sqrt(n·p·(1−p)); 5 sd is a one-in-millions false alarm.
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (fails - n as f64 * p).abs() < 5.0 * sd,
                "p={p}: {fails} of {n}"
            );
            let again = outcomes(&mut eio(p, Directions::Both, seed), n, Direction::Read);
            assert_eq!(got, again, "same seed, same IOs fail");
            let other = outcomes(
                &mut eio(p, Directions::Both, seed + 100),
                n,
                Direction::Read,
            );
            assert_ne!(got, other, "another seed, other IOs");
        }
    }

    #[test]
    fn eio_and_latency_respect_direction_and_extremes() {
        let all = outcomes(&mut eio(1.0, Directions::Write, 7), 1_000, Direction::Write);
        assert!(all.iter().all(|o| *o == Outcome::FailEio));
        let none = outcomes(&mut eio(1.0, Directions::Write, 7), 1_000, Direction::Read);
        assert!(none.iter().all(|o| *o == Outcome::Deliver));
        let zero = outcomes(&mut eio(0.0, Directions::Both, 7), 1_000, Direction::Read);
        assert!(zero.iter().all(|o| *o == Outcome::Deliver));

        let spec = LatencySpec {
            add_us: Some(2_000),
            distribution: None,
            fraction: 1.0,
            direction: Directions::Read,
        };
        let mut lat = LatencyFault::new(&spec, fault_rng(1, 0));
        assert_eq!(
            lat.on_issue(0, Direction::Read, 4096),
            Outcome::DelayBy(2_000_000)
        );
        assert_eq!(lat.on_issue(0, Direction::Write, 4096), Outcome::Deliver);
    }

    #[test]
    fn latency_distributions_have_their_shape() {
        let n = 50_000;
        let mut uni = LatencyFault::new(
            &LatencySpec {
                add_us: None,
                distribution: Some(LatencyDistribution::Uniform {
                    min_us: 100,
                    max_us: 300,
                }),
                fraction: 1.0,
                direction: Directions::Both,
            },
            fault_rng(9, 0),
        );
        let d: Vec<u64> = (0..n)
            .map(|_| match uni.on_issue(0, Direction::Read, 4096) {
                Outcome::DelayBy(ns) => ns,
                o => panic!("{o:?}"),
            })
            .collect();
        assert!(d.iter().all(|&x| (100_000..=300_000).contains(&x)));
        let mean = d.iter().sum::<u64>() as f64 / n as f64;
        assert!((mean - 200_000.0).abs() < 2_000.0, "{mean}");

        let mut exp = LatencyFault::new(
            &LatencySpec {
                add_us: None,
                distribution: Some(LatencyDistribution::Exponential { mean_us: 1_000 }),
                fraction: 0.5,
                direction: Directions::Both,
            },
            fault_rng(9, 1),
        );
        let d: Vec<u64> = (0..n)
            .filter_map(|_| match exp.on_issue(0, Direction::Write, 4096) {
                Outcome::DelayBy(ns) => Some(ns),
                _ => None,
            })
            .collect();
        let share = d.len() as f64 / n as f64;
        assert!((share - 0.5).abs() < 0.02, "{share}");
        let mean = d.iter().sum::<u64>() as f64 / d.len() as f64;
        assert!((mean - 1_000_000.0).abs() < 40_000.0, "{mean}");
    }

    #[test]
    fn drop_writes_touches_only_writes() {
        let mut f = DropWritesFault::new(&DropWritesSpec { fraction: 1.0 }, fault_rng(0, 0));
        assert_eq!(f.on_issue(0, Direction::Write, 4096), Outcome::DropWrite);
        assert_eq!(f.on_issue(0, Direction::Read, 4096), Outcome::Deliver);
    }

    #[test]
    fn windows_are_respected() {
        let mut set = FaultSet::new();
        set.push(
            Window {
                start_ns: 10 * MS,
                end_ns: 20 * MS,
            },
            Box::new(eio(1.0, Directions::Both, 1)),
        );
        assert_eq!(
            set.on_issue(10 * MS - 1, Direction::Read, 1),
            Outcome::Deliver
        );
        assert_eq!(set.on_issue(10 * MS, Direction::Read, 1), Outcome::FailEio);
        assert_eq!(
            set.on_issue(20 * MS - 1, Direction::Read, 1),
            Outcome::FailEio
        );
        assert_eq!(set.on_issue(20 * MS, Direction::Read, 1), Outcome::Deliver);
    }

    #[test]
    fn strongest_outcome_wins_and_delays_add() {
        let lat = |us| {
            Box::new(LatencyFault::new(
                &LatencySpec {
                    add_us: Some(us),
                    distribution: None,
                    fraction: 1.0,
                    direction: Directions::Both,
                },
                fault_rng(0, 0),
            ))
        };
        let mut set = FaultSet::new();
        set.push(Window::ALWAYS, lat(100));
        set.push(
            Window {
                start_ns: 0,
                end_ns: 10,
            },
            lat(50),
        );
        set.push(
            Window {
                start_ns: 5,
                end_ns: 10,
            },
            Box::new(DropWritesFault::new(
                &DropWritesSpec { fraction: 1.0 },
                fault_rng(0, 1),
            )),
        );
        set.push(
            Window {
                start_ns: 7,
                end_ns: 10,
            },
            Box::new(eio(1.0, Directions::Read, 0)),
        );
        assert_eq!(
            set.on_issue(0, Direction::Write, 1),
            Outcome::DelayBy(150_000)
        );
        assert_eq!(set.on_issue(6, Direction::Write, 1), Outcome::DropWrite);
        assert_eq!(
            set.on_issue(6, Direction::Read, 1),
            Outcome::DelayBy(150_000)
        );
        assert_eq!(set.on_issue(8, Direction::Read, 1), Outcome::FailEio);
        assert_eq!(set.on_issue(8, Direction::Write, 1), Outcome::DropWrite);
        assert_eq!(
            set.on_issue(10, Direction::Write, 1),
            Outcome::DelayBy(100_000)
        );
    }

    #[test]
    fn stall_until_is_the_window_end_and_chains() {
        let mut set = FaultSet::new();
        let w1 = Window {
            start_ns: 100 * MS,
            end_ns: 200 * MS,
        };
        let w2 = Window {
            start_ns: 200 * MS,
            end_ns: 250 * MS,
        };
        let w3 = Window {
            start_ns: 400 * MS,
            end_ns: u64::MAX,
        };
        for w in [w1, w2, w3] {
            set.push(w, Box::new(StallFault::new(w)));
        }
        assert_eq!(set.stalled_until(99 * MS), None);
        assert_eq!(
            set.stalled_until(100 * MS),
            Some(250 * MS),
            "back-to-back stalls are one"
        );
        assert_eq!(set.stalled_until(220 * MS), Some(250 * MS));
        assert_eq!(set.stalled_until(250 * MS), None);
        assert_eq!(set.stalled_until(500 * MS), Some(u64::MAX));
        // Issuing is not affected by a stall.
        assert_eq!(
            set.on_issue(150 * MS, Direction::Write, 1),
            Outcome::Deliver
        );
        let alone = StallFault::new(w1);
        assert_eq!(
            (alone.stalled_until(150 * MS), alone.stalled_until(200 * MS)),
            (Some(200 * MS), None)
        );
    }
}
