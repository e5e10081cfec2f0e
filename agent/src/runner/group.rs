//! A stonewall group: one thread per clone of its jobs, started together at one barrier.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::SystemTime;

use super::RunOptions;
use super::clone::{CloneCtx, run_clone};
use crate::job::JobSpec;
use crate::layout::PlannedFile;
use crate::report::JobReport;
use crate::stats::JobStats;

pub(super) fn run_group(
    jobs: &[JobSpec],
    plans: &[Vec<Vec<PlannedFile>>],
    range: std::ops::Range<usize>,
    groupid: u32,
    opts: &RunOptions,
) -> Vec<JobReport> {
    let clones: usize = jobs[range.clone()].iter().map(|j| j.numjobs as usize).sum();
    let barrier = Arc::new(StartBarrier::new(clones));
    let run_seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    // Reports come back over a channel and the threads are never joined: a thread that gave
    // up on IOs a device never answered cannot finish exiting (the kernel waits for its ring's
    // requests), but its report is sent before that, and the scope only waits for the
    // closures to return. A panicking clone still makes the scope panic, as a join did.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, JobReport)>();
    let mut count = 0usize;
    let tx_failed = tx.clone();
    std::thread::scope(|scope| {
        'spawn: for idx in range.clone() {
            let job = &jobs[idx];
            for clone in 0..job.numjobs {
                let base = if job.randrepeat {
                    job.randseed
                } else {
                    run_seed
                };
                let seed = mix(base, idx as u64, clone as u64);
                let faults = opts
                    .faults
                    .as_ref()
                    .map(|f| f(idx, clone))
                    .unwrap_or_default();
                let ctx = CloneCtx {
                    job,
                    job_index: idx,
                    clone,
                    groupid,
                    files: &plans[idx][clone as usize],
                    seed,
                    barrier: barrier.clone(),
                    opts,
                    faults,
                };
                let (tx, n) = (tx.clone(), count);
                count += 1;
                let spawned = std::thread::Builder::new()
                    .name(format!("{}.{}", job.name, clone))
                    .spawn_scoped(scope, move || {
                        let _ = tx.send((n, run_clone(ctx)));
                    });
                if let Err(e) = spawned {
                    // The clones already started must not wait for the rest at the barrier,
                    // and a run missing clones measures something else: stop it.
                    barrier.forfeit(clones - n);
                    opts.stop.store(true, Ordering::Relaxed);
                    let _ = tx_failed.send((n, failed_clone(job, clone, groupid, &e)));
                    break 'spawn;
                }
            }
        }
    });
    drop(tx);
    drop(tx_failed);
    let mut reports: Vec<(usize, JobReport)> = rx.into_iter().collect();
    reports.sort_by_key(|(n, _)| *n);
    reports.into_iter().map(|(_, r)| r).collect()
}

/// The report of a clone whose thread could not be started.
fn failed_clone(job: &JobSpec, clone: u32, groupid: u32, e: &std::io::Error) -> JobReport {
    JobReport {
        spec: job.clone(),
        clone,
        groupid,
        stats: JobStats::new(job.rate.is_limited()),
        error: Some(format!(
            "cannot start the clone's thread: {e}; the run was stopped (lower numjobs, or \
             raise the host's thread limits)"
        )),
        started: SystemTime::now(),
        verify: None,
        abandoned: Vec::new(),
    }
}

/// The start barrier of a stonewall group: `std::sync::Barrier`, except that parties that
/// will never arrive (a clone whose thread could not be started) can be counted out with
/// `forfeit`, so the clones already waiting are released instead of waiting forever.
pub(super) struct StartBarrier {
    state: Mutex<BarrierState>,
    released: Condvar,
}

struct BarrierState {
    arrived: usize,
    expected: usize,
    open: bool,
    leader_taken: bool,
}

impl StartBarrier {
    pub(super) fn new(expected: usize) -> Self {
        StartBarrier {
            state: Mutex::new(BarrierState {
                arrived: 0,
                expected,
                open: expected == 0,
                leader_taken: false,
            }),
            released: Condvar::new(),
        }
    }

    /// Waits until every expected party has arrived (or been counted out); exactly one
    /// returning party is told it is the leader.
    pub(super) fn wait(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.arrived += 1;
        if s.arrived >= s.expected {
            s.open = true;
            self.released.notify_all();
        }
        while !s.open {
            s = self.released.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        !std::mem::replace(&mut s.leader_taken, true)
    }

    /// Counts out `n` parties that will never arrive.
    fn forfeit(&self, n: usize) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.expected = s.expected.saturating_sub(n);
        if s.arrived >= s.expected {
            s.open = true;
            self.released.notify_all();
        }
    }
}

/// SplitMix-style mixing so clones and jobs get independent streams from one seed.
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A clone that could not be started is counted out, so the ones waiting start anyway,
    /// and exactly one of them leads (reports the group's start).
    #[test]
    fn the_start_barrier_releases_when_missing_parties_are_counted_out() {
        let barrier = Arc::new(StartBarrier::new(3));
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let b = barrier.clone();
                std::thread::spawn(move || b.wait())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            waiting.iter().all(|h| !h.is_finished()),
            "released too early"
        );
        barrier.forfeit(1);
        let leaders: usize = waiting
            .into_iter()
            .map(|h| h.join().unwrap() as usize)
            .sum();
        assert_eq!(leaders, 1);
        // Without a forfeit it is a plain barrier: the last to arrive opens it.
        let barrier = Arc::new(StartBarrier::new(2));
        let b = barrier.clone();
        let first = std::thread::spawn(move || b.wait());
        let second = barrier.wait();
        assert_eq!(first.join().unwrap() as usize + second as usize, 1);
    }
}
