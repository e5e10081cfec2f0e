//! Interval lag: how long after an interval's end the run loop has every agent's report of it.
//!
//! The figure that says whether the coordinator keeps up: reports queue in front of the run
//! loop while it merges, so a coordinator short of CPU shows it here first, as a lag that
//! grows interval after interval. Pure: arrival times in, lags out (times are ms since the
//! synchronized start on the coordinator's monotonic clock).

use std::collections::BTreeMap;

/// Intervals still waiting for reports are given up on (counted complete at their last
/// arrival) once this many later ones are open too: an agent that was lost never sends them.
const OPEN_LIMIT: usize = 8;

/// An interval whose reports are all in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completed {
    pub index: u64,
    /// Last report's arrival minus the interval's end (never below 0).
    pub lag_ms: u64,
}

#[derive(Debug, Default)]
pub struct LagMeter {
    interval_ms: u64,
    /// Open intervals: reports so far and the latest arrival.
    open: BTreeMap<u64, (usize, u64)>,
    /// Lag of every completed interval, in completion order. 8 bytes an interval: a 12-hour
    /// run at 1 s keeps 350 KB.
    lags: Vec<u64>,
    worst: Option<Completed>,
}

/// What `LagMeter::summary` says of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct LagSummary {
    pub intervals: usize,
    pub median_ms: u64,
    pub worst: Completed,
    /// Median of the last 10 intervals: a lag that grows shows here above the median.
    pub last_median_ms: u64,
}

impl LagMeter {
    pub fn new(interval_ms: u64) -> Self {
        LagMeter {
            interval_ms: interval_ms.max(1),
            ..Default::default()
        }
    }

    /// A report of interval `index` reached the run loop at `at_ms`, when `expected` agents are
    /// still streaming. Returns the intervals this completes.
    pub fn arrived(&mut self, index: u64, at_ms: u64, expected: usize) -> Vec<Completed> {
        let e = self.open.entry(index).or_insert((0, at_ms));
        e.0 += 1;
        e.1 = e.1.max(at_ms);
        let mut done = Vec::new();
        if e.0 >= expected {
            let (_, last) = self.open.remove(&index).unwrap_or_default();
            done.push(self.complete(index, last));
        }
        while self.open.len() > OPEN_LIMIT {
            let (i, (_, last)) = self.open.pop_first().expect("more than OPEN_LIMIT open");
            done.push(self.complete(i, last));
        }
        done
    }

    /// The run ended: whatever is still open is complete as it is.
    pub fn finish(&mut self) -> Vec<Completed> {
        let open = std::mem::take(&mut self.open);
        open.into_iter()
            .map(|(i, (_, last))| self.complete(i, last))
            .collect()
    }

    fn complete(&mut self, index: u64, last_ms: u64) -> Completed {
        let end_ms = (index + 1) * self.interval_ms;
        let c = Completed {
            index,
            lag_ms: last_ms.saturating_sub(end_ms),
        };
        self.lags.push(c.lag_ms);
        if self.worst.is_none_or(|w| c.lag_ms > w.lag_ms) {
            self.worst = Some(c);
        }
        c
    }

    pub fn summary(&self) -> Option<LagSummary> {
        let median = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let worst = self.worst?;
        let tail = &self.lags[self.lags.len().saturating_sub(10)..];
        Some(LagSummary {
            intervals: self.lags.len(),
            median_ms: median(&self.lags),
            worst,
            last_median_ms: median(tail),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_is_complete_with_its_last_expected_report() {
        let mut m = LagMeter::new(1000);
        assert!(m.arrived(0, 1_010, 3).is_empty());
        assert!(m.arrived(0, 1_030, 3).is_empty());
        assert_eq!(
            m.arrived(0, 1_020, 3),
            [Completed {
                index: 0,
                lag_ms: 30
            }]
        );
        // Early arrivals (an agent's clock ahead) are no lag at all.
        assert_eq!(m.arrived(1, 1_990, 1)[0].lag_ms, 0);
        let s = m.summary().unwrap();
        assert_eq!((s.intervals, s.worst.lag_ms, s.worst.index), (2, 30, 0));
    }

    #[test]
    fn intervals_a_lost_agent_never_completes_are_closed_when_too_many_are_open() {
        let mut m = LagMeter::new(1000);
        let mut done = Vec::new();
        for i in 0..=OPEN_LIMIT as u64 {
            // Two agents expected, only one reports.
            done.extend(m.arrived(i, (i + 1) * 1000 + 5, 2));
        }
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].index, 0);
        assert_eq!(m.finish().len(), OPEN_LIMIT);
        let s = m.summary().unwrap();
        assert_eq!((s.intervals, s.median_ms, s.last_median_ms), (9, 5, 5));
    }

    #[test]
    fn a_growing_lag_shows_in_the_last_intervals() {
        let mut m = LagMeter::new(1000);
        for i in 0..40u64 {
            m.arrived(i, (i + 1) * 1000 + i * 100, 1);
        }
        let s = m.summary().unwrap();
        assert_eq!(s.worst.index, 39);
        assert!(s.last_median_ms > s.median_ms, "{s:?}");
    }
}
