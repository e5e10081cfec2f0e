//! One interval report per interval for all of an agent's volumes: each volume's runner closes
//! its interval on its own thread, and the coordinator merges an agent's report in one go
//! (its volumes found by position, one message to decode instead of one per volume), so the
//! event hub holds a volume's interval until every volume of the run has closed it.
//!
//! Pure: events in, events out, no clock. A volume that stops reporting (its job ended, its
//! device hung) does not hold the others back for long: an interval is sent as it is once a
//! later one is two intervals ahead, and every other event (a fault, the final result) sends
//! what is held first, so the order the coordinator sees stays the order things happened.

use std::collections::BTreeMap;

use lockstep_proto::v1::{IntervalReport, RunEvent, run_event};

pub struct IntervalBatcher {
    /// The run's volumes (0: no batching, every event passes through).
    volumes: usize,
    pending: BTreeMap<u64, IntervalReport>,
}

impl IntervalBatcher {
    pub fn new(volumes: usize) -> Self {
        IntervalBatcher {
            volumes,
            pending: BTreeMap::new(),
        }
    }

    /// Takes one event; gives the events to send now, in order.
    pub fn push(&mut self, ev: RunEvent) -> Vec<RunEvent> {
        let interval = match ev.event {
            Some(run_event::Event::Interval(iv)) if self.volumes > 1 => iv,
            other => {
                let mut out = self.flush();
                out.push(RunEvent { event: other, ..ev });
                return out;
            }
        };
        let k = interval.index;
        let slot = self.pending.entry(k).or_insert_with(|| IntervalReport {
            index: k,
            ..Default::default()
        });
        slot.end_agent_ns = slot.end_agent_ns.max(interval.end_agent_ns);
        slot.len_ns = slot.len_ns.max(interval.len_ns);
        slot.volumes.extend(interval.volumes);
        let complete = slot.volumes.len() >= self.volumes;
        // Everything up to k when k is complete; anything two behind k in any case.
        let upto = if complete { k + 1 } else { k.saturating_sub(1) };
        let later = self.pending.split_off(&upto);
        let ready = std::mem::replace(&mut self.pending, later);
        ready.into_values().map(event).collect()
    }

    /// Everything held, in interval order.
    pub fn flush(&mut self) -> Vec<RunEvent> {
        std::mem::take(&mut self.pending)
            .into_values()
            .map(event)
            .collect()
    }
}

fn event(iv: IntervalReport) -> RunEvent {
    RunEvent {
        seq: 0,
        event: Some(run_event::Event::Interval(iv)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_proto::v1::{FinalResult, VolumeInterval};

    fn iv(k: u64, volume: &str) -> RunEvent {
        event(IntervalReport {
            index: k,
            end_agent_ns: k as i64,
            len_ns: 1,
            volumes: vec![VolumeInterval {
                volume: volume.into(),
                ..Default::default()
            }],
        })
    }

    fn shape(evs: &[RunEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match &e.event {
                Some(run_event::Event::Interval(iv)) => {
                    let names: Vec<&str> = iv.volumes.iter().map(|v| v.volume.as_str()).collect();
                    format!("{}:{}", iv.index, names.join("+"))
                }
                Some(run_event::Event::Final(_)) => "final".into(),
                _ => "other".into(),
            })
            .collect()
    }

    #[test]
    fn an_interval_goes_once_every_volume_closed_it() {
        let mut b = IntervalBatcher::new(3);
        assert!(b.push(iv(0, "a")).is_empty());
        assert!(b.push(iv(0, "c")).is_empty());
        assert_eq!(shape(&b.push(iv(0, "b"))), ["0:a+c+b"]);
        assert!(b.push(iv(1, "a")).is_empty());
    }

    #[test]
    fn a_silent_volume_holds_the_others_two_intervals_at_most() {
        let mut b = IntervalBatcher::new(2);
        // "b" stopped reporting after interval 0.
        assert_eq!(shape(&b.push(iv(0, "a"))), Vec::<String>::new());
        assert_eq!(shape(&b.push(iv(0, "b"))), ["0:a+b"]);
        assert!(b.push(iv(1, "a")).is_empty());
        assert!(b.push(iv(2, "a")).is_empty());
        assert_eq!(shape(&b.push(iv(3, "a"))), ["1:a"]);
        let fin = RunEvent {
            seq: 0,
            event: Some(run_event::Event::Final(FinalResult::default())),
        };
        assert_eq!(shape(&b.push(fin)), ["2:a", "3:a", "final"]);
    }

    #[test]
    fn one_volume_passes_straight_through() {
        let mut b = IntervalBatcher::new(1);
        assert_eq!(shape(&b.push(iv(0, "a"))), ["0:a"]);
        let mut none = IntervalBatcher::new(0);
        assert_eq!(shape(&none.push(iv(5, "a"))), ["5:a"]);
    }
}
