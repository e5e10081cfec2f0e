//! Progress of the agents' file layout during Prepare (issue #17): a layout of large files can
//! take minutes before the first IO, and a coordinator that only says "preparing" looks hung.
//!
//! Each agent is asked `LayoutStatus` about once a second while its Prepare is under way; the
//! answers are summed into the cluster's bytes and the slowest agent (the furthest from done),
//! which the run's observer draws. `summarize` is pure; `watch` does the asking.

use std::time::Duration;

use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::v1::LayoutStatusRequest;
use tokio::sync::mpsc;

use super::client::Client;

/// One agent's answer: bytes written and to write, and whether its layout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentLayout {
    pub done: u64,
    pub total: u64,
    pub finished: bool,
}

/// The cluster's layout at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LayoutProgress {
    /// Agents being prepared.
    pub agents: usize,
    /// Agents that have answered at least once (older agents never do).
    pub reporting: usize,
    pub done: u64,
    pub total: u64,
    /// The agent furthest from done, with its own bytes, while any is unfinished.
    pub slowest: Option<(String, AgentLayout)>,
    /// Every agent's Prepare has answered: this is the last report of the layout.
    pub finished: bool,
    /// Since the agents were asked to prepare.
    pub elapsed: Duration,
}

impl LayoutProgress {
    /// Done as a fraction of the total (1 when there is nothing to write).
    pub fn fraction(&self) -> f64 {
        fraction(self.done, self.total)
    }
}

fn fraction(done: u64, total: u64) -> f64 {
    if total == 0 {
        1.0
    } else {
        (done as f64 / total as f64).min(1.0)
    }
}

/// Sums the agents' answers (None: no answer yet, or an agent that cannot say). The slowest
/// agent is the unfinished one with the smallest fraction done; among equals, the one with
/// the most bytes left, as it will finish last at equal speed.
pub fn summarize(agents: &[(String, Option<AgentLayout>)]) -> LayoutProgress {
    let mut p = LayoutProgress {
        agents: agents.len(),
        ..LayoutProgress::default()
    };
    for (name, status) in agents {
        let Some(s) = status else { continue };
        p.reporting += 1;
        p.done += s.done.min(s.total);
        p.total += s.total;
        if s.finished || s.total == 0 {
            continue;
        }
        let left = s.total - s.done.min(s.total);
        let behind = match &p.slowest {
            None => true,
            Some((_, w)) => {
                let (f, fw) = (fraction(s.done, s.total), fraction(w.done, w.total));
                f < fw || (f == fw && left > w.total - w.done.min(w.total))
            }
        };
        if behind {
            p.slowest = Some((name.clone(), *s));
        }
    }
    p
}

/// How often agents are asked: often enough for a bar to move, rarely enough that a thousand
/// agents cost the coordinator a thousand small calls a second at most.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Asks every agent for its layout progress every `POLL_EVERY` and sends the summary, until
/// the receiver is dropped. An agent that answers UNIMPLEMENTED (it predates `LayoutStatus`)
/// is not asked again; one that does not answer within a second keeps its last answer.
pub fn watch(agents: Vec<(String, Client)>, run_id: String) -> mpsc::Receiver<LayoutProgress> {
    let (tx, rx) = mpsc::channel(1);
    let began = std::time::Instant::now();
    tokio::spawn(async move {
        let mut last: Vec<(String, Option<AgentLayout>)> =
            agents.iter().map(|(n, _)| (n.clone(), None)).collect();
        let mut asking: Vec<bool> = vec![true; agents.len()];
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            let calls = agents
                .iter()
                .zip(&asking)
                .enumerate()
                .filter(|(_, (_, ask))| **ask)
                .map(|(i, ((_, client), _))| {
                    let mut client = client.clone();
                    let req = LayoutStatusRequest {
                        protocol_version: PROTOCOL_VERSION,
                        run_id: run_id.clone(),
                    };
                    async move {
                        let r = tokio::time::timeout(POLL_EVERY, client.layout_status(req)).await;
                        (i, r)
                    }
                });
            for (i, r) in super::run::futures_join(calls).await {
                match r {
                    Ok(Ok(reply)) => {
                        let r = reply.into_inner();
                        last[i].1 = Some(AgentLayout {
                            done: r.bytes_done,
                            total: r.bytes_total,
                            finished: r.finished,
                        });
                    }
                    Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => asking[i] = false,
                    _ => {}
                }
            }
            let p = LayoutProgress {
                elapsed: began.elapsed(),
                ..summarize(&last)
            };
            if tx.send(p).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// "1.50 GiB": layout sizes for people.
pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// The progress line printed where there is no terminal to draw a bar on.
pub fn line(p: &LayoutProgress) -> String {
    if p.finished {
        return format!(
            "laid out {} on {} agents in {:.1} s",
            bytes(p.total),
            p.agents,
            p.elapsed.as_secs_f64()
        );
    }
    let slowest = match &p.slowest {
        Some((name, s)) => format!(
            ", slowest {name} at {:.0}% ({} of {})",
            100.0 * fraction(s.done, s.total),
            bytes(s.done),
            bytes(s.total)
        ),
        None => String::new(),
    };
    let silent = if p.reporting < p.agents {
        format!(" ({} agents report no progress)", p.agents - p.reporting)
    } else {
        String::new()
    };
    format!(
        "laying out files: {} of {} ({:.0}%) on {} agents{slowest}{silent}",
        bytes(p.done),
        bytes(p.total),
        100.0 * p.fraction(),
        p.agents
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(done: u64, total: u64, finished: bool) -> Option<AgentLayout> {
        Some(AgentLayout {
            done,
            total,
            finished,
        })
    }

    #[test]
    fn sums_the_cluster_and_names_the_agent_furthest_behind() {
        let p = summarize(&[
            ("a1".into(), a(900, 1000, false)),
            ("a2".into(), a(100, 1000, false)),
            ("a3".into(), None),
            ("a4".into(), a(500, 500, true)),
        ]);
        assert_eq!((p.agents, p.reporting, p.done, p.total), (4, 3, 1500, 2500));
        assert_eq!(p.slowest.as_ref().unwrap().0, "a2");
        assert!((p.fraction() - 0.6).abs() < 1e-9);
        let l = line(&p);
        assert!(l.contains("slowest a2 at 10%"), "{l}");
        assert!(l.contains("(1 agents report no progress)"), "{l}");
    }

    #[test]
    fn equal_fractions_name_the_agent_with_more_left() {
        let p = summarize(&[
            ("small".into(), a(10, 100, false)),
            ("big".into(), a(100, 1000, false)),
        ]);
        assert_eq!(p.slowest.unwrap().0, "big");
    }

    #[test]
    fn finished_and_empty_layouts_are_never_the_slowest() {
        let p = summarize(&[
            ("done".into(), a(0, 0, true)),
            ("nothing".into(), a(0, 0, false)),
            ("ended".into(), a(5, 10, true)),
        ]);
        assert_eq!(p.slowest, None);
        assert_eq!(p.fraction(), 0.5);
        assert_eq!(summarize(&[]).fraction(), 1.0);
    }

    #[test]
    fn sizes_read_like_sizes() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 29), "1.50 GiB");
        assert_eq!(bytes(64 << 20), "64.00 MiB");
    }
}
