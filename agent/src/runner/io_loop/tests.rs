//! The IO loop's tests: whole runs through `run_jobs`, and its event methods driven one at a
//! time on the null engine.

use std::time::{Duration, Instant};

use super::super::{IntervalSummary, RunOptions, run_jobs};
use super::reap::due_wake;

/// fio's reaping (`iodepth_batch_complete_max=1`, the default) against every completion at
/// once, on buffered reads of a small cached file through the worker-thread engine (the
/// fallback that runs io_uring and libaio jobs where io_uring is refused), whose IOs finish
/// at once: with one taken per pass most of the depth waits, finished, and is counted as
/// waiting (and in flight, as fio counts it); taking all at once leaves none waiting. The
/// null engine takes all at once whatever the option says, as fio's does.
#[test]
fn with_fio_reaping_finished_ios_wait_and_are_counted_as_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let run = |engine: &str, max: u32| {
        let text = format!(
            "[j]\nioengine={engine}\nrw=randread\nbs=4k\niodepth=8\nsize=1m\nruntime=300ms\n\
                 time_based\niodepth_batch_complete_max={max}\ndirectory={}\n",
            dir.path().display()
        );
        let jobs =
            crate::jobfile::parse_str(&text, std::path::Path::new("t.fio"), None, &[]).unwrap();
        let opts = RunOptions {
            interval: Duration::from_millis(100),
            ..RunOptions::default()
        };
        let report = run_jobs(&jobs, &opts).unwrap();
        let st = &report.jobs[0].stats;
        assert!(st.dirs[0].ios > 1000, "{} IOs", st.dirs[0].ios);
        let n = st.intervals.len() as f64;
        let mean = |f: fn(&IntervalSummary) -> f64| st.intervals.iter().map(f).sum::<f64>() / n;
        (mean(|iv| iv.outstanding), mean(|iv| iv.waiting))
    };
    let (outstanding, waiting) = run("psync", 1);
    println!("one per pass: {waiting:.2} waiting of {outstanding:.2} in flight");
    assert!(
        waiting > 0.3 && outstanding >= waiting,
        "one per pass: {waiting} waiting of {outstanding} in flight"
    );
    let (outstanding, waiting) = run("psync", 8);
    assert_eq!(waiting, 0.0, "all at once: {outstanding} in flight");
    let (outstanding, waiting) = run("null", 1);
    assert_eq!(waiting, 0.0, "null: {outstanding} in flight");
}

#[test]
fn the_wait_is_bounded_by_what_is_due_and_a_drain_waits_for_completions() {
    let now = Instant::now();
    let ms = |n: u64| now + Duration::from_millis(n);
    // Running: the earliest of tick, deadline, issue time, gated IO and held completion.
    assert_eq!(
        due_wake(false, ms(1000), Some(ms(500)), None, None, None, None),
        ms(500)
    );
    assert_eq!(
        due_wake(
            false,
            ms(1000),
            Some(ms(500)),
            Some([Some(ms(7)), None]),
            Some(ms(9)),
            None,
            None
        ),
        ms(7)
    );
    assert_eq!(
        due_wake(
            false,
            ms(1000),
            None,
            None,
            Some(ms(30)),
            Some(ms(20)),
            None
        ),
        ms(20)
    );
    // Past the deadline and stopping: the past deadline would make the wait a poll (a spin
    // for as long as the last IOs take); the drain waits until the next tick instead.
    let past = now - Duration::from_millis(5);
    assert_eq!(
        due_wake(false, ms(1000), Some(past), None, None, None, None),
        past
    );
    assert_eq!(
        due_wake(true, ms(1000), Some(past), None, None, None, None),
        ms(1000)
    );
    // A drain also wakes when the IOs still in flight are to be given up on.
    assert_eq!(
        due_wake(true, ms(1000), Some(past), None, None, None, Some(ms(300))),
        ms(300)
    );
}

/// Drives one clone's `IoLoop` by hand: a null-engine job parsed from `text` (no files), set
/// up as a clone is, handed to `drive`; returns the clone's report.
fn drive_loop(
    text: &str,
    opts: &RunOptions,
    drive: impl FnOnce(super::IoLoop<'_>),
) -> crate::report::JobReport {
    use std::sync::Arc;

    use super::super::clone::{CloneCtx, set_up};
    use super::super::group::StartBarrier;

    let jobs = crate::jobfile::parse_str(text, std::path::Path::new("t.fio"), None, &[]).unwrap();
    let job = &jobs[0];
    let ctx = CloneCtx {
        job,
        job_index: 0,
        clone: 0,
        groupid: 0,
        files: &[],
        seed: 7,
        barrier: Arc::new(StartBarrier::new(1)),
        opts,
        faults: Default::default(),
    };
    let io = set_up(&ctx, None).unwrap();
    let mut report = crate::report::JobReport {
        spec: job.clone(),
        clone: 0,
        groupid: 0,
        stats: crate::stats::JobStats::new(false),
        error: None,
        started: std::time::SystemTime::now(),
        verify: None,
        abandoned: Vec::new(),
    };
    drive(super::IoLoop::new(&ctx, &mut report, io, None, None));
    report
}

const NULL_JOB: &str = "[j]\nioengine=null\nrw=randread\nbs=4k\niodepth=4\nsize=1m\n";

/// Issue fills every free slot on an engine that does not interleave; reap takes what the
/// engine finished and complete frees the slots and counts the IOs in the interval.
#[test]
fn issue_fills_the_depth_and_complete_frees_it() {
    let opts = RunOptions::default();
    drive_loop(NULL_JOB, &opts, |mut l| {
        let now = Instant::now();
        l.carry_to(now);
        l.issue(now, false);
        l.submit_queued();
        assert_eq!(l.inflight, 4);
        assert!(l.free.is_empty() && l.slots.iter().all(Option::is_some));
        l.reap(false);
        assert_eq!(l.completions.len(), 4, "the null engine finishes at once");
        l.complete(now);
        assert_eq!(l.inflight, 0);
        assert_eq!(l.free.len(), 4);
        assert_eq!((l.iv[0].ios, l.iv[0].bytes, l.iv[1].ios), (4, 16384, 0));
        assert!(l.completions.is_empty() && l.seen.is_empty());
    });
}

/// A stop request makes the pass a stopping one: the deadline is brought to now, nothing
/// more is issued, and with nothing in flight the loop ends.
#[test]
fn a_stop_issues_nothing_more_and_ends_the_loop() {
    let opts = RunOptions::default();
    drive_loop(NULL_JOB, &opts, |mut l| {
        let now = Instant::now();
        assert!(!l.stopping(now));
        assert!(!l.idle(now, false), "a sized job with IO left goes on");
        opts.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(l.stopping(now));
        assert_eq!(l.deadline, Some(now));
        l.issue(now, true);
        assert_eq!(l.inflight, 0);
        assert!(l.idle(now, true));
    });
}

/// A tick well past a boundary closes the interval at its boundary and the ones missed empty
/// (intervals stay on the clock), each handed to the sink with its index.
#[test]
fn a_late_tick_closes_the_missed_intervals_on_the_clock() {
    use std::sync::Mutex;
    struct Sink(Mutex<Vec<(usize, u64)>>);
    impl super::super::IntervalSink for Sink {
        fn on_interval(&self, s: super::super::IntervalSnapshot<'_>) {
            self.0.lock().unwrap().push((s.index, s.summary.ios[0]));
        }
    }
    let sink = std::sync::Arc::new(Sink(Mutex::new(Vec::new())));
    let opts = RunOptions {
        interval: Duration::from_millis(100),
        sink: Some(sink.clone()),
        ..RunOptions::default()
    };
    let report = drive_loop(NULL_JOB, &opts, |mut l| {
        let now = l.t0;
        l.issue(now, false);
        l.reap(false);
        l.complete(now);
        let late = l.t0 + Duration::from_millis(350);
        l.tick(late);
        assert_eq!(l.next_tick, l.t0 + Duration::from_millis(400));
        assert_eq!(l.last_tick, l.t0 + Duration::from_millis(300));
    });
    let ends: Vec<Duration> = report.stats.intervals.iter().map(|i| i.end).collect();
    assert_eq!(
        ends,
        [100, 200, 300].map(Duration::from_millis).to_vec(),
        "closed at their boundaries"
    );
    assert_eq!(*sink.0.lock().unwrap(), vec![(0, 4), (1, 0), (2, 0)]);
    assert_eq!(report.stats.dirs[0].ios, 4);
}

/// Draining, IOs the device never finishes are waited for only while the drain limit has not
/// passed since the last progress; then they are listed as stuck, the clone fails with "the
/// device stopped answering", and `finish` leaves its resources to the device.
#[test]
fn a_quiet_drain_gives_up_on_the_ios_in_flight() {
    let opts = RunOptions::default();
    let job = format!("{NULL_JOB}stuck_timeout=1s\n");
    let report = drive_loop(&job, &opts, |mut l| {
        let now = Instant::now();
        l.carry_to(now);
        l.issue(now, false);
        l.submit_queued();
        // The device swallows them: the engine will never report them.
        let mut lost = Vec::new();
        l.engine.reap(0, Some(Duration::ZERO), &mut lost).unwrap();
        assert_eq!((lost.len(), l.inflight), (4, 4));
        assert!(!l.give_up_if_quiet(now), "the drain has just begun");
        assert!(!l.give_up_if_quiet(now + Duration::from_millis(900)));
        assert!(l.give_up_if_quiet(now + Duration::from_millis(1000)));
        assert_eq!(l.abandoned, 4);
        let err = l.finish().unwrap_err();
        assert!(
            err.starts_with("the device stopped answering: 4 IO(s)"),
            "{err}"
        );
    });
    assert_eq!(report.stats.stuck_count, 4);
    assert!(report.stats.stuck.iter().all(|s| !s.completed));
}

/// `run` then `finish` on a sized job: every IO of the size is issued, completed and counted,
/// in the intervals too.
#[test]
fn a_sized_job_runs_to_its_end() {
    let opts = RunOptions::default();
    let report = drive_loop(NULL_JOB, &opts, |mut l| {
        l.run();
        assert!(l.exhausted && l.inflight == 0);
        l.finish().unwrap();
    });
    let st = &report.stats;
    assert_eq!((st.dirs[0].ios, st.dirs[0].bytes), (256, 1 << 20));
    assert_eq!(st.intervals.iter().map(|i| i.ios[0]).sum::<u64>(), 256);
}

/// A verifying job whose state table is over the memory limit (made 0 here) runs with the
/// table in a file mapped from its directory, verifies clean, and leaves no table file behind
/// (the saved state goes with the data files, as before).
#[test]
fn a_verifying_job_with_its_table_on_the_volume_verifies_clean_and_leaves_nothing() {
    use std::sync::Mutex;
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{}/v.0.verify-table (deleted)", dir.path().display());
    struct Maps(String, Mutex<Vec<bool>>);
    impl super::super::IntervalSink for Maps {
        fn on_interval(&self, _: super::super::IntervalSnapshot<'_>) {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            self.1.lock().unwrap().push(maps.contains(&self.0));
        }
    }
    let sink = std::sync::Arc::new(Maps(table, Mutex::new(Vec::new())));
    let text = format!(
        "[v]\nioengine=psync\nrw=randwrite\nbs=4k\nsize=2m\nverify=crc32c\nruntime=400ms\n\
         time_based\ndirectory={}\n",
        dir.path().display()
    );
    let jobs = crate::jobfile::parse_str(&text, std::path::Path::new("t.fio"), None, &[]).unwrap();
    let opts = RunOptions {
        interval: Duration::from_millis(100),
        sink: Some(sink.clone()),
        verify_memory_limit: 0,
        ..RunOptions::default()
    };
    let report = run_jobs(&jobs, &opts).unwrap();
    let v = report.jobs[0].verify.as_ref().expect("verified");
    assert_eq!(v.blocks, 512, "every block of 2 MiB written: {v:?}");
    assert_eq!((v.good, v.bad()), (512, 0), "{v:?}");
    let seen = sink.1.lock().unwrap().clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|&m| m),
        "mapped while running: {seen:?}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
