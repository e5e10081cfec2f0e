//! Clock offsets between the coordinator and each agent, and the achieved start skew.
//!
//! One probe is (coordinator time sent t0, agent time a, coordinator time received t1). If the
//! request and the reply took equally long, the agent read its clock at (t0 + t1) / 2 of ours,
//! so offset = a - (t0 + t1) / 2, with an error of at most half the round trip. Queueing makes
//! round trips longer, never shorter, so the sample with the lowest round trip has the smallest
//! error bound: keep that one (NTP's clock filter does the same).

use serde::{Deserialize, Serialize};

/// One probe, all in unix nanoseconds (t0, t1 coordinator clock; agent_ns agent clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub t0: i64,
    pub agent_ns: i64,
    pub t1: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClockEstimate {
    /// Agent clock minus coordinator clock.
    pub offset_ns: i64,
    /// Round trip of the probe used; the offset is exact to within half of it.
    pub rtt_ns: i64,
    pub probes: u32,
}

impl ClockEstimate {
    /// An instant of the coordinator's clock in the agent's clock.
    pub fn to_agent(&self, coordinator_ns: i64) -> i64 {
        coordinator_ns + self.offset_ns
    }
    /// An instant of the agent's clock in the coordinator's clock.
    pub fn to_coordinator(&self, agent_ns: i64) -> i64 {
        agent_ns - self.offset_ns
    }
}

/// The lowest-round-trip estimate, or None without probes.
pub fn estimate(probes: &[Probe]) -> Option<ClockEstimate> {
    let best = probes
        .iter()
        .filter(|p| p.t1 >= p.t0)
        .min_by_key(|p| p.t1 - p.t0)?;
    Some(ClockEstimate {
        offset_ns: best.agent_ns - (best.t0 + (best.t1 - best.t0) / 2),
        rtt_ns: best.t1 - best.t0,
        probes: probes.len() as u32,
    })
}

/// Achieved start skew: the spread of the actual starts, in the coordinator's clock.
pub fn skew_ns(actual_starts: &[i64]) -> Option<i64> {
    let min = actual_starts.iter().min()?;
    let max = actual_starts.iter().max()?;
    Some(max - min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keeps_the_lowest_round_trip() {
        let probes = [
            Probe {
                t0: 0,
                agent_ns: 5_000 + 900,
                t1: 2_000,
            },
            Probe {
                t0: 10_000,
                agent_ns: 10_000 + 5_000 + 100,
                t1: 10_200,
            },
        ];
        let e = estimate(&probes).unwrap();
        assert_eq!(e.rtt_ns, 200);
        assert_eq!(e.offset_ns, 5_000);
        assert_eq!(e.to_agent(1_000), 6_000);
        assert_eq!(e.to_coordinator(6_000), 1_000);
        assert!(estimate(&[]).is_none());
        assert_eq!(skew_ns(&[5, 9, 7]), Some(4));
    }

    proptest! {
        /// With any delays, the error is at most half the chosen round trip.
        #[test]
        fn error_bounded_by_half_rtt(
            offset in -1_000_000_000i64..1_000_000_000,
            legs in prop::collection::vec((0i64..5_000_000, 0i64..5_000_000), 1..20),
        ) {
            let mut t = 1_700_000_000_000_000_000i64;
            let probes: Vec<Probe> = legs.iter().map(|&(out, back)| {
                let p = Probe { t0: t, agent_ns: t + out + offset, t1: t + out + back };
                t += 10_000_000;
                p
            }).collect();
            let e = estimate(&probes).unwrap();
            prop_assert!((e.offset_ns - offset).abs() <= e.rtt_ns / 2 + 1);
        }
    }
}
