//! The open-loop rate scheduler: when each IO is *meant* to be issued.
//!
//! Pure: a target rate and a seed in, a sequence of intended issue times (ns since the job's
//! start) out. The runner issues an IO no earlier than its intended time and measures latency
//! from that time as well as from the actual issue, so a stall that delays issuing is counted
//! against the IOs it delayed (no coordinated omission, wrk2-style). Intended times never depend
//! on completions: that is what makes the load open-loop.
//!
//! - `linear` (fio's default `rate_process`): IO i is intended at i / rate, computed from i, not
//!   accumulated, so there is no drift over long runs;
//! - `poisson`: exponentially distributed gaps with mean 1 / rate (fio's `rate_process=poisson`),
//!   the arrival process of many independent clients.

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::job::RateProcess;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RateError {
    #[error("rate must be a positive number of IOs per second, got {0}")]
    NotPositive(f64),
}

#[derive(Debug, Clone)]
pub struct RateScheduler {
    ios_per_sec: f64,
    process: RateProcess,
    /// IOs scheduled so far (linear).
    count: u64,
    /// Last intended time (poisson), ns.
    t_ns: f64,
    rng: Xoshiro256PlusPlus,
}

impl RateScheduler {
    pub fn new(ios_per_sec: f64, process: RateProcess, seed: u64) -> Result<Self, RateError> {
        if !(ios_per_sec.is_finite() && ios_per_sec > 0.0) {
            return Err(RateError::NotPositive(ios_per_sec));
        }
        Ok(RateScheduler {
            ios_per_sec,
            process,
            count: 0,
            t_ns: 0.0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
        })
    }

    pub fn ios_per_sec(&self) -> f64 {
        self.ios_per_sec
    }

    /// The intended issue time of the next IO, in ns since the start. The first IO is at 0.
    pub fn next_intended_ns(&mut self) -> u64 {
        match self.process {
            RateProcess::Linear => {
                let t = self.count as f64 * 1e9 / self.ios_per_sec;
                self.count += 1;
                t as u64
            }
            RateProcess::Poisson => {
                let t = self.t_ns;
                // Inverse transform: -ln(U) / rate, U in (0, 1].
                let u: f64 = 1.0 - self.rng.random::<f64>();
                self.t_ns += -u.ln() * 1e9 / self.ios_per_sec;
                self.count += 1;
                t as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linear_is_evenly_spaced_without_drift() {
        let mut r = RateScheduler::new(3.0, RateProcess::Linear, 0).unwrap();
        let t: Vec<u64> = (0..4).map(|_| r.next_intended_ns()).collect();
        assert_eq!(t, vec![0, 333_333_333, 666_666_666, 1_000_000_000]);
        let mut r = RateScheduler::new(5000.0, RateProcess::Linear, 0).unwrap();
        let last = (0..=5_000_000)
            .map(|_| r.next_intended_ns())
            .last()
            .unwrap();
        assert_eq!(last, 1_000_000_000_000);
    }

    #[test]
    fn refuses_non_positive_rates() {
        assert_eq!(
            RateScheduler::new(0.0, RateProcess::Linear, 0).err(),
            Some(RateError::NotPositive(0.0))
        );
        assert!(RateScheduler::new(f64::NAN, RateProcess::Poisson, 0).is_err());
    }

    proptest! {
        #[test]
        fn poisson_mean_rate_and_monotonic(seed in any::<u64>(), rate in 100.0f64..100_000.0) {
            let mut r = RateScheduler::new(rate, RateProcess::Poisson, seed).unwrap();
            let n = 20_000;
            let mut last = 0;
            for _ in 0..n {
                let t = r.next_intended_ns();
                prop_assert!(t >= last);
                last = t;
            }
            let achieved = (n - 1) as f64 / (last as f64 / 1e9);
            // Sum of n exponentials: relative sd 1/sqrt(n) = 0.7%; allow 5 sd.
            prop_assert!((achieved / rate - 1.0).abs() < 0.036, "rate {} achieved {}", rate, achieved);
        }

        #[test]
        fn same_seed_same_arrivals(seed in any::<u64>()) {
            let mut a = RateScheduler::new(1000.0, RateProcess::Poisson, seed).unwrap();
            let mut b = RateScheduler::new(1000.0, RateProcess::Poisson, seed).unwrap();
            for _ in 0..100 {
                prop_assert_eq!(a.next_intended_ns(), b.next_intended_ns());
            }
        }
    }
}
