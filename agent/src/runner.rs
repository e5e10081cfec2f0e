//! Runs jobs: one OS thread per job clone, each with its own engine, buffers and generator.
//!
//! The hot loop takes a clock reading at the top of each pass, one after each submit and one
//! when completions are seen (one for all of them), records into per-interval histograms, and
//! folds them into the job's totals once per interval, so per-IO cost is a generator step, an
//! engine queue and three histogram increments. On io_uring it interleaves as fio does: one IO
//! per submit, the completions made visible by that submit taken without a system call, and a
//! wait only when no slot is free (see `interleave` in `clone_body`).
//!
//! Time line of a clone: set-up (open, allocate) → start barrier shared by its stonewall group →
//! `startdelay` → `ramp_time` (IO runs, nothing is kept) → timed part (`runtime`, or until the
//! generator is done) → `end_fsync` → verify. Groups (split at `stonewall`) run one after the other.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::budget;
use crate::engine::{self, Completion, IoOp};
use crate::fault::{Admission, IoFault, IoGate, Outcome};
use crate::job::errpolicy::{self, ErrorCount, ErrorKind};
use crate::job::{Direction, EngineKind, JobSpec};
use crate::layout::{self, CreatedFiles, LayoutError, LayoutProgress, PlannedFile};
use crate::limits;
use crate::rate::RateScheduler;
use crate::report::{JobReport, RunReport};
use crate::stats::{
    DirStats, IntervalSummary, JobStats, STUCK_LIMIT, StuckIo, depth_bucket, record,
};
use crate::verify::{self, VerifyReport, VerifyState};
use crate::workload::{Generator, WorkloadParams};

/// A finished interval of one job clone, with its own (not cumulative) histograms. The agent
/// daemon ships these to the coordinator; a standalone run ignores them.
pub struct IntervalSnapshot<'a> {
    /// Which interval of the clone's timed part this is (0-based).
    pub index: usize,
    pub job_index: usize,
    pub job_name: &'a str,
    pub clone: u32,
    pub summary: &'a IntervalSummary,
    pub dirs: &'a [DirStats; 2],
}

pub trait IntervalSink: Send + Sync {
    fn on_interval(&self, snapshot: IntervalSnapshot<'_>);
    /// IO of a stonewall group began (every clone of the group passed the start barrier).
    fn on_group_started(&self, _groupid: u32, _at: SystemTime) {}
    /// A clone finished; it reports no more intervals.
    fn on_clone_done(&self, _job_index: usize, _clone: u32) {}
}

/// Faults for one job clone's IO path (built by the caller from a plan's fault schedule).
#[derive(Default)]
pub struct CloneFaults {
    pub gate: Option<Box<dyn IoGate>>,
    pub fault: Option<Box<dyn IoFault>>,
    /// Called first on the clone's thread, before its engine starts any thread of its own
    /// (the kernel throttle moves the thread into its cgroup here). An error ends the clone.
    pub enter: Option<Box<dyn FnOnce() -> Result<(), String> + Send>>,
}

/// Builds the faults of (job index, clone); `None` for no faults.
pub type FaultFactory = dyn Fn(usize, u32) -> CloneFaults + Send + Sync;

/// Cumulative counters for a live view, updated once per interval by every clone.
#[derive(Debug, Default)]
pub struct LiveCounters {
    pub ios: [AtomicU64; 2],
    pub bytes: [AtomicU64; 2],
    pub errors: AtomicU64,
    /// Clones still running.
    pub running: AtomicU64,
}

pub struct RunOptions {
    pub allow_block_devices: bool,
    pub keep_files: bool,
    /// Set to stop every job early (Ctrl-C, coordinator abort); results so far are kept.
    pub stop: Arc<AtomicBool>,
    pub interval: Duration,
    pub sink: Option<Arc<dyn IntervalSink>>,
    pub live: Arc<LiveCounters>,
    pub faults: Option<Arc<FaultFactory>>,
    /// Draws layout progress (a hidden bar when not on a terminal).
    pub layout_progress: Box<dyn LayoutProgress + Send + Sync>,
    /// Begin IO at this instant of the system clock (the coordinator's synchronized start,
    /// already converted to this host's clock); every clone is set up and waiting before it.
    pub start_at: Option<SystemTime>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            allow_block_devices: false,
            keep_files: false,
            stop: Arc::new(AtomicBool::new(false)),
            interval: Duration::from_secs(1),
            sink: None,
            live: Arc::new(LiveCounters::default()),
            faults: None,
            layout_progress: Box::new(layout::NoProgress),
            start_at: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("job '{job}': {message}")]
    Setup { job: String, message: String },
    /// The run does not fit the host (memory, threads, open files, disk): refused before IO.
    #[error(transparent)]
    Budget(#[from] budget::BudgetError),
}

/// Runs every job of a job file and returns what they measured: `prepare` then `execute`.
/// Set-up problems (bad targets, layout failures) are errors before any timed IO; IO errors
/// during the run end the job that hit them (as fio's default `continue_on_error=none`) and are
/// reported in its `JobReport`, unless the job's `continue_on_error` covers them: then they are
/// counted and the job goes on (see `errpolicy`).
pub fn run_jobs(jobs: &[JobSpec], opts: &RunOptions) -> Result<RunReport, RunError> {
    Ok(prepare(jobs, opts)?.execute(opts))
}

/// Jobs whose targets are checked and laid out, ready to start at an instant: the agent daemon
/// prepares before the coordinator's synchronized start so that no layout delays it.
pub struct PreparedRun {
    jobs: Vec<JobSpec>,
    plans: Vec<Vec<Vec<PlannedFile>>>,
    created: CreatedFiles,
}

/// Validates every job, checks that the run fits the host's memory, threads and open files,
/// plans every file and checks that they fit the free disk space (anything refused is
/// refused before anything is written) and lays files out: files that are read or verified
/// are filled with data first.
pub fn prepare(jobs: &[JobSpec], opts: &RunOptions) -> Result<PreparedRun, RunError> {
    let mut clones = 0u64;
    for job in jobs {
        validate(job)?;
        clones += job.numjobs as u64;
        if let Some(problem) = limits::total_jobs_problem(clones) {
            return Err(RunError::Setup {
                job: job.name.clone(),
                message: format!("{}: numjobs={}: {problem}", job.origin, job.numjobs),
            });
        }
    }
    budget::check_host(jobs, &budget::host_figures())?;
    let mut plans: Vec<Vec<Vec<PlannedFile>>> = Vec::new();
    for job in jobs {
        let mut per_clone = Vec::new();
        for clone in 0..job.numjobs {
            per_clone.push(if job.engine == EngineKind::Null {
                Vec::new()
            } else {
                layout::plan_files(job, clone)?
            });
        }
        plans.push(per_clone);
    }
    check_verified_files_are_private(jobs, &plans)?;
    let all_files: Vec<PlannedFile> = plans.iter().flatten().flatten().cloned().collect();
    budget::check_disk(&budget::disk_needs(&all_files))?;
    let mut created = CreatedFiles::default();
    let needs_data = |j: &JobSpec| j.pattern.reads() || j.verify.is_some();
    let files_of = |want_data: bool| -> Vec<PlannedFile> {
        jobs.iter()
            .zip(&plans)
            .filter(|(j, _)| needs_data(j) == want_data)
            .flat_map(|(_, p)| p.iter().flatten().cloned())
            .collect()
    };
    let steps = [(files_of(true), true), (files_of(false), false)];
    for (files, fill) in &steps {
        if let Err(e) = layout::lay_out(
            files,
            *fill,
            opts.allow_block_devices,
            &mut created,
            &*opts.layout_progress,
        ) {
            created.remove_all();
            return Err(e.into());
        }
    }
    Ok(PreparedRun {
        jobs: jobs.to_vec(),
        plans,
        created,
    })
}

impl PreparedRun {
    pub fn jobs(&self) -> &[JobSpec] {
        &self.jobs
    }

    /// Runs the jobs now, group after group (split at `stonewall`), then removes the files it
    /// created unless asked to keep them.
    pub fn execute(mut self, opts: &RunOptions) -> RunReport {
        let started = SystemTime::now();
        let t_start = Instant::now();
        let jobs = &self.jobs;
        let mut reports = Vec::new();
        let mut groupid = 0u32;
        let mut i = 0;
        while i < jobs.len() {
            let mut end = i + 1;
            while end < jobs.len() && !jobs[end].stonewall {
                end += 1;
            }
            if opts.stop.load(Ordering::Relaxed) {
                break;
            }
            reports.extend(run_group(jobs, &self.plans, i..end, groupid, opts));
            groupid += 1;
            i = end;
        }
        // Files whose device stopped answering stay: removing them would wait on it too.
        self.created.files.retain(|f| {
            let p = &f.path;
            let abandoned = reports.iter().any(|r| r.abandoned.contains(p));
            if abandoned {
                tracing::warn!(
                    "{}: left in place, its device stopped answering; remove it once the device is back",
                    p.display()
                );
            }
            !abandoned
        });
        self.discard(opts.keep_files);
        // A verify state is only worth keeping beside the data it describes.
        for r in &mut reports {
            if let Some(v) = r.verify.as_mut() {
                let scope = &r.spec.scope;
                v.state_files.retain(|sp| {
                    let keep = verify::data_files_exist(std::path::Path::new(sp));
                    if !keep {
                        let _ = scope.remove(std::path::Path::new(sp));
                    }
                    keep
                });
            }
        }
        RunReport {
            jobs: reports,
            started,
            elapsed: t_start.elapsed(),
        }
    }

    /// Removes what `prepare` created (unless `keep`), for a run that will not start.
    pub fn discard(&mut self, keep: bool) {
        if !keep {
            for problem in self.created.remove_all() {
                tracing::warn!("{problem}");
            }
        }
    }
}

/// A verifying clone keeps the generation of every block it wrote, so no other clone may
/// write its files: clones sharing a file (`filename=` with `numjobs` > 1, or two jobs naming
/// one file) would overwrite each other's blocks and every overwritten block would be
/// reported as lost. Refused before anything is written.
fn check_verified_files_are_private(
    jobs: &[JobSpec],
    plans: &[Vec<Vec<PlannedFile>>],
) -> Result<(), RunError> {
    let mut writers: HashMap<&std::path::Path, Vec<(usize, u32)>> = HashMap::new();
    for (j, per_clone) in plans.iter().enumerate() {
        if !jobs[j].pattern.writes() {
            continue;
        }
        for (c, files) in per_clone.iter().enumerate() {
            for f in files {
                let users = writers.entry(f.path.as_path()).or_default();
                if !users.contains(&(j, c as u32)) {
                    users.push((j, c as u32));
                }
            }
        }
    }
    for (path, users) in &writers {
        if users.len() < 2 {
            continue;
        }
        if let Some(&(j, _)) = users.iter().find(|&&(j, _)| jobs[j].verify.is_some()) {
            let who: Vec<String> = users
                .iter()
                .map(|&(j, c)| format!("'{}' clone {c}", jobs[j].name))
                .collect();
            return Err(RunError::Setup {
                job: jobs[j].name.clone(),
                message: format!(
                    "verify=crc32c needs files no other job or clone writes, but {} is written by {}; \
                     verification is per clone, so give each clone its own files (drop filename= and \
                     use directory=, or numjobs=1)",
                    path.display(),
                    who.join(", ")
                ),
            });
        }
    }
    Ok(())
}

fn validate(job: &JobSpec) -> Result<(), RunError> {
    let err = |message: String| RunError::Setup {
        job: job.name.clone(),
        message,
    };
    if let Some(problem) = limits::numjobs_problem(job.numjobs) {
        return Err(err(format!(
            "{}: numjobs={}: {problem}",
            job.origin, job.numjobs
        )));
    }
    if let Some(problem) = limits::iodepth_problem(job.engine, job.iodepth) {
        return Err(err(format!(
            "{}: iodepth={}: {problem}",
            job.origin, job.iodepth
        )));
    }
    // Where io_uring is refused, io_uring and libaio jobs fall back to a thread per IO in
    // flight; a depth that fallback cannot run is refused now, not when the clone starts.
    let uring = matches!(job.engine, EngineKind::IoUring | EngineKind::Libaio);
    if uring && job.iodepth > limits::MAX_SYNC_WORKERS && !engine::uring_available() {
        return Err(err(format!(
            "{}: iodepth={}: io_uring is not available here, and the pread/pwrite fallback \
             runs at most {} IOs in flight (one thread each); lower iodepth or allow io_uring",
            job.origin,
            job.iodepth,
            limits::MAX_SYNC_WORKERS
        )));
    }
    if job.time_based && job.runtime.is_none() {
        return Err(err(
            "time_based needs runtime= (otherwise the job never ends)".into(),
        ));
    }
    if job.direct {
        for &(bs, _) in job.bs.iter().flatten() {
            if bs % 512 != 0 {
                return Err(err(format!(
                    "direct=1 needs block sizes that are multiples of 512; bs={bs}"
                )));
            }
        }
    }
    if job.max_bs() > u32::MAX as u64 / 2 {
        return Err(err(format!(
            "block size {} is too large (at most 1 GiB)",
            job.max_bs()
        )));
    }
    if job.verify.is_some() && job.pattern.writes() {
        verify::check_job(job).map_err(err)?;
    }
    Ok(())
}

fn run_group(
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
struct StartBarrier {
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
    fn new(expected: usize) -> Self {
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
    fn wait(&self) -> bool {
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

struct CloneCtx<'a> {
    job: &'a JobSpec,
    job_index: usize,
    clone: u32,
    groupid: u32,
    files: &'a [PlannedFile],
    seed: u64,
    barrier: Arc<StartBarrier>,
    opts: &'a RunOptions,
    faults: CloneFaults,
}

/// IO buffers: one `max_bs` buffer per slot, 4 KiB aligned for O_DIRECT, in one allocation.
struct Buffers {
    ptr: *mut u8,
    layout: std::alloc::Layout,
    slot_len: usize,
}

impl Buffers {
    /// Allocates and fills the buffers; running out of memory is an error for the clone (the
    /// budget checked before IO makes it rare), never an abort of the whole agent.
    fn new(slots: usize, slot_len: usize, seed: u64) -> Result<Self, String> {
        let slot_len = slot_len.next_multiple_of(4096);
        let size = slots.checked_mul(slot_len);
        let layout = size
            .and_then(|size| std::alloc::Layout::from_size_align(size, 4096).ok())
            .ok_or_else(|| {
                format!("{slots} IO buffers of {slot_len} bytes do not fit in memory")
            })?;
        // SAFETY: non-zero size (slots >= 1, slot_len >= 4096).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!(
                "cannot allocate {} of IO buffers (iodepth x largest bs); lower iodepth or bs",
                budget::gib(layout.size() as u64)
            ));
        }
        // SAFETY: ptr is valid for layout.size() bytes, owned by us.
        let all = unsafe { std::slice::from_raw_parts_mut(ptr, layout.size()) };
        layout::fill_pseudo_random(all, seed);
        Ok(Buffers {
            ptr,
            layout,
            slot_len,
        })
    }
    fn slot(&self, i: usize) -> *mut u8 {
        // SAFETY: i < slots, so the offset stays inside the allocation.
        unsafe { self.ptr.add(i * self.slot_len) }
    }
    fn slice(&mut self, i: usize, len: usize) -> &mut [u8] {
        // SAFETY: the slot is ours while no IO using it is in flight (caller's invariant).
        unsafe { std::slice::from_raw_parts_mut(self.slot(i), len) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[derive(Clone, Copy)]
struct Slot {
    dir: Direction,
    file: u32,
    offset: u64,
    len: u32,
    ready: Instant,
    submitted: Instant,
    intended: Option<Instant>,
    outcome: Outcome,
    /// Write generation of a verified write (0: not verified).
    generation: u32,
    /// Index in the stuck list once listed while still in flight.
    stuck: Option<u32>,
}

/// Per-thread resource usage, for fio's cpu line.
fn thread_rusage() -> libc::rusage {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    }
}

fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000)
}

/// Counts a failed IO under the job's `continue_on_error` and says whether the job goes on
/// (the slot is already free for the next IO) or stops at it, as fio decides.
fn goes_on(job: &JobSpec, count: &mut ErrorCount, dir: Direction, result: i64) -> bool {
    let errno = (-result) as i32;
    job.on_error
        .on_error(count, ErrorKind::of(dir, errno), errno, 1)
}

/// Counts the blocks verification found bad as fio counts verify errors (EILSEQ each) and
/// says whether they leave the job without an error (`continue_on_error=verify` or `all`).
fn verify_goes_on(job: &JobSpec, count: &mut ErrorCount, bad: u64) -> bool {
    job.on_error
        .on_error(count, ErrorKind::Verify, errpolicy::EILSEQ, bad)
}

/// The job's error for a failed IO: what, where, and the OS's reason.
fn io_failure(files: &[PlannedFile], slot: &Slot, result: i64) -> String {
    let path = files
        .get(slot.file as usize)
        .map(|f| f.path.display().to_string())
        .unwrap_or_default();
    format!(
        "{} of {} bytes at offset {} of {path} failed: {}",
        slot.dir.name(),
        slot.len,
        slot.offset,
        errno_text(result)
    )
}

fn errno_text(result: i64) -> String {
    let err = std::io::Error::from_raw_os_error((-result) as i32);
    format!("{err}{}", layout::io_hint(&err))
}

/// How often a verifying clone checkpoints its state (see `verify::save_checkpoint`).
const VERIFY_CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

fn run_clone(mut ctx: CloneCtx<'_>) -> JobReport {
    let job = ctx.job;
    let open_loop = job.rate.is_limited();
    let mut report = JobReport {
        spec: job.clone(),
        clone: ctx.clone,
        groupid: ctx.groupid,
        stats: JobStats::new(open_loop),
        error: None,
        started: SystemTime::now(),
        verify: None,
        abandoned: Vec::new(),
    };
    let live = &ctx.opts.live;
    live.running.fetch_add(1, Ordering::Relaxed);
    let result = clone_body(&mut ctx, &mut report);
    live.running.fetch_sub(1, Ordering::Relaxed);
    if let Err(message) = result {
        report.error = Some(message);
    }
    if let Some(sink) = &ctx.opts.sink {
        sink.on_clone_done(ctx.job_index, ctx.clone);
    }
    report
}

fn clone_body(ctx: &mut CloneCtx<'_>, report: &mut JobReport) -> Result<(), String> {
    let job = ctx.job;
    let depth = job.iodepth.max(1) as usize;
    let null = job.engine == EngineKind::Null;
    let writes = job.pattern.writes();
    // Set-up errors must still release the barrier, or the rest of the group waits forever.
    let mut enter = ctx.faults.enter.take();
    let setup = (|| -> Result<_, String> {
        if let Some(enter) = enter.take() {
            enter()?;
        }
        let mut files: Vec<File> = Vec::new();
        for f in ctx.files {
            let file = layout::open_target(
                &f.scope,
                &f.path,
                job.direct,
                writes || job.verify.is_some(),
            )
            .map_err(|e| e.to_string())?;
            if job.invalidate && !job.direct {
                layout::invalidate(&file);
            }
            files.push(file);
        }
        let regions = if null {
            // The null engine touches nothing; give the generator a large virtual file.
            vec![crate::workload::FileRegion {
                offset: 0,
                len: match job.size {
                    Some(crate::job::Extent::Bytes(b)) if b > 0 => b,
                    _ => 1 << 40,
                },
            }]
        } else {
            ctx.files.iter().map(|f| f.region).collect()
        };
        // Saturating: each region ends before 2^63, but several can add up past 2^64.
        let total: u64 = regions.iter().map(|r| r.len).fold(0, u64::saturating_add);
        let params = WorkloadParams {
            pattern: job.pattern,
            rwmixread: job.rwmixread,
            bs: job.bs.clone(),
            files: regions,
            distribution: job.distribution,
            norandommap: job.norandommap,
            io_limit: if job.time_based {
                None
            } else {
                Some(job.io_size.unwrap_or(total))
            },
            wrap: job.time_based,
            align: job.min_bs(),
        };
        let generator = Generator::new(params, ctx.seed).map_err(|e| e.to_string())?;
        let rate = rate_ios_per_sec(job)
            .map(|r| RateScheduler::new(r, job.rate.process, ctx.seed ^ 0xA5A5))
            .transpose()
            .map_err(|e| e.to_string())?;
        // Buffers are allocated and filled before the barrier so that a synchronized start
        // is not delayed by touching (possibly hundreds of MiB of) memory.
        let buffers = Buffers::new(depth, job.max_bs() as usize, ctx.seed)?;
        // The engine is built last, with the files and buffers it may register; both outlive
        // it (the engine is dropped, or forgotten with them, at the end of the clone).
        let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
        let resources = engine::Resources {
            fds: &fds,
            buffers: Some((buffers.ptr, buffers.layout.size())),
            register: engine::Registered {
                files: job.registerfiles,
                buffers: job.fixedbufs,
            },
        };
        let engine =
            engine::build(job.engine, depth as u32, &resources).map_err(|e| e.to_string())?;
        Ok((files, fds, generator, engine, rate, buffers))
    })();
    let leader = ctx.barrier.wait();
    // Real-time priority (where permitted) only for the wake-up itself: the start instant is
    // read while still holding it, then the thread is an ordinary one again. (Holding it to
    // the first submit made eight clones on two cores queue behind each other for ~5 ms.)
    let mut started = SystemTime::now();
    if ctx.groupid == 0 {
        if let Some(at) = ctx.opts.start_at {
            let priority = wait_until_realtime(at, &ctx.opts.stop);
            started = SystemTime::now();
            drop(priority);
        }
    }
    if leader {
        if let Some(sink) = &ctx.opts.sink {
            sink.on_group_started(ctx.groupid, started);
        }
    }
    let (files, fds, mut generator, mut engine, mut rate, mut buffers) = setup?;
    if !job.startdelay.is_zero() {
        sleep_unless_stopped(job.startdelay, &ctx.opts.stop);
    }
    let mut gate = ctx.faults.gate.take();
    let mut fault = ctx.faults.fault.take();
    let verifying = job.verify.is_some() && !null;
    let mut vstate = VerifyState::new(ctx.seed);
    // Checkpoints of the verify state while writing, saved off the IO thread, so an agent that
    // dies mid-run leaves a state to verify after a restart.
    let mut next_checkpoint = Instant::now() + VERIFY_CHECKPOINT_EVERY;
    let mut checkpointing: Option<std::thread::JoinHandle<()>> = None;
    // A write to a block that already has one in flight waits here (see `verify`).
    let mut deferred: Option<crate::workload::IoRequest> = None;
    let stuck_ns = job.stuck_timeout.as_nanos() as u64;
    // After the job's end the loop waits for the IOs in flight, as long as they keep completing.
    // A device that has stopped answering would hold the run (and a cluster's drill) forever:
    // once nothing has completed for `stuck_timeout` (fio's 300 s when the list is off), the
    // rest are given up on (see `give_up`).
    let drain_limit = if stuck_ns > 0 {
        job.stuck_timeout
    } else {
        FIO_REAP_TIMEOUT
    };
    // Since the job's end: the last instant an IO completed (or the end itself).
    let mut last_progress: Option<Instant> = None;
    let mut abandoned = 0usize;

    let stats = &mut report.stats;
    let mut iv = [DirStats::new(rate.is_some()), DirStats::new(rate.is_some())];
    let mut slots: Vec<Option<Slot>> = vec![None; depth];
    let mut free: Vec<u32> = (0..depth as u32).rev().collect();
    let mut completions: Vec<Completion> = Vec::with_capacity(depth);
    // Completions seen (with the instant they were seen) and not yet handled.
    let mut seen: std::collections::VecDeque<(Completion, Instant)> =
        std::collections::VecDeque::with_capacity(depth);
    // The last reap waited (or could have): the next completions may be a burst.
    let mut woke = false;
    // fio's iodepth_batch_complete_max: completions handled per pass. Below the depth, the
    // others wait in `seen`, finished, counted in flight and in their clat, as in fio's loop;
    // `wait_area` integrates how many wait, so the report can tell them from IOs at the device.
    // fio's null engine hands back every pending completion whatever the maximum (its
    // getevents ignores max), so it measures the loop without any of them waiting; so here.
    let complete_max = if null {
        depth
    } else {
        job.complete_max.max(1) as usize
    };
    let reap_all = complete_max >= depth;
    let mut wait_area = 0f64;
    // `seen` only changes where completions are handled; the integral is carried to there
    // (and to the top of each pass) from here.
    let mut last_wait = Instant::now();
    let mut queued_now: Vec<u32> = Vec::with_capacity(depth);

    let t0 = Instant::now();
    let mut measuring = job.ramp_time.is_zero();
    let mut timed_start = t0;
    let ramp_end = t0 + job.ramp_time;
    let mut deadline = job.runtime.map(|r| t0 + job.ramp_time + r);
    let interval = ctx.opts.interval;
    let mut next_tick = timed_start + interval;
    let mut last_tick = timed_start;
    let mut ru_start = thread_rusage();
    let rate_origin = t0;
    let mut next_intended: Option<Instant> = rate
        .as_mut()
        .map(|r| rate_origin + Duration::from_nanos(r.next_intended_ns()));
    let mut not_before: Option<Instant> = None;
    let mut since_think = 0u32;
    let mut writes_since_sync = 0u32;
    let sync_every = if job.fsync > 0 {
        job.fsync
    } else {
        job.fdatasync
    };
    let mut sync_pending = false;
    let mut exhausted = false;
    let mut inflight = 0usize;
    // IOs handed to the device per submit call (fio's iodepth_batch_submit default).
    let submit_batch = 1usize;
    // Interleaving engines (io_uring): one IO per pass of the loop, then the completions
    // already visible are looked at without a system call (the submit made them visible). As
    // in fio's default loop, one of them is taken per pass (`complete_max`,
    // iodepth_batch_complete_max) and the rest wait, finished, with that wait in their clat;
    // with `complete_max` at the depth all are taken and timestamped at once, so a completion
    // is seen at most one submit after the device finished it. Issuing a whole refill before
    // looking (the loop for other engines) left completions unseen until the refill in
    // progress ended, and made every IO of a refill wait for the submits ahead of it (slat
    // 15 us against fio's 2).
    let interleave = engine.capabilities().interleave;
    let issue_per_pass = if interleave { 1 } else { usize::MAX };
    // The last pass stopped issuing at `issue_per_pass` with slots still free.
    let mut more_to_issue;
    // IOs taken from the generator and counted in flight, waiting for their gate's instant.
    let mut gated: std::collections::VecDeque<(Instant, IoOp)> = std::collections::VecDeque::new();
    // Completions held back by a fault (added latency, stall) until their due instant. The
    // loop never sleeps for them: IOs keep being issued on schedule (open loop) and intervals
    // keep closing on time while completions are held.
    let mut held: Vec<(Instant, Completion)> = Vec::new();
    let mut area = 0f64; // integral of inflight over time in the current interval (IO·ns)
    let mut last_now = t0;
    let mut failure: Option<String> = None;
    let stop = &ctx.opts.stop;
    let gate_origin = t0;

    loop {
        let now = Instant::now();
        area += inflight as f64 * now.saturating_duration_since(last_now).as_nanos() as u64 as f64;
        if !reap_all {
            // (With every completion handled at once, the few held for one pass are taken out
            // of `area` when handled, so they must not be counted here too.)
            carry_wait(&mut wait_area, &mut last_wait, seen.len(), now);
        }
        last_now = last_now.max(now);
        if !measuring && now >= ramp_end {
            measuring = true;
            timed_start = now;
            for d in iv.iter_mut() {
                d.reset();
            }
            stats.sync = Default::default();
            stats.depth_hist = [0; 7];
            next_tick = now + interval;
            last_tick = now;
            area = 0.0;
            wait_area = 0.0;
            ru_start = thread_rusage();
        }
        if measuring && now >= next_tick {
            if stuck_ns > 0 {
                // IOs still in flight past the timeout are listed now, not only if they ever
                // complete (a hung device never answers).
                for s in slots.iter_mut().flatten() {
                    let age = now.saturating_duration_since(s.ready).as_nanos() as u64;
                    if s.stuck.is_none() && age > stuck_ns {
                        s.stuck = Some(note_stuck(stats, ctx.files, s, t0, age, false));
                    }
                }
            }
            // Intervals stay on the clock: when the thread was held up well past a boundary (a
            // pause fault stopped the process, a long preemption), the interval closes at its
            // boundary and any it missed close empty, so interval N is always N..N+1 intervals
            // after the start, as on every other clone and agent it is merged with. A tick
            // seen a little late closes then, as usual.
            while now >= next_tick {
                let end = if now - next_tick <= interval / 10 {
                    now
                } else {
                    next_tick
                };
                close_interval(
                    ctx,
                    stats,
                    &mut iv,
                    [&mut area, &mut wait_area],
                    last_tick,
                    end,
                    timed_start,
                );
                last_tick = end;
                next_tick += interval;
            }
            if verifying
                && now >= next_checkpoint
                && !vstate.blocks.is_empty()
                && checkpointing.as_ref().is_none_or(|h| h.is_finished())
            {
                next_checkpoint = now + VERIFY_CHECKPOINT_EVERY;
                if let Some(first) = ctx.files.first() {
                    let path = verify::state_path(&first.path, &job.name, ctx.clone);
                    let names: Vec<String> = ctx.files.iter().map(|f| absolute(&f.path)).collect();
                    let (snapshot, name, clone) = (vstate.clone(), job.name.clone(), ctx.clone);
                    let scope = first.scope.clone();
                    checkpointing = Some(std::thread::spawn(move || {
                        if let Err(e) =
                            verify::save_checkpoint(&scope, &path, &name, clone, &names, &snapshot)
                        {
                            tracing::warn!("verify checkpoint: {e}");
                        }
                    }));
                }
            }
        }
        let time_up = deadline.is_some_and(|d| now >= d);
        let stopping = time_up || failure.is_some() || stop.load(Ordering::Relaxed);
        if stopping {
            deadline = Some(now.min(deadline.unwrap_or(now)));
        }

        // Deliver the held completions that are due (all of them when stopping).
        if !held.is_empty() {
            let mut i = 0;
            while i < held.len() {
                if held[i].0 <= now || stopping {
                    completions.push(held.swap_remove(i).1);
                } else {
                    i += 1;
                }
            }
        }
        // Start the gated IOs whose time has come (all of them when stopping).
        queued_now.clear();
        while let Some(&(t, op)) = gated.front() {
            if t > now && !stopping {
                break;
            }
            gated.pop_front();
            match engine.queue(op) {
                Ok(()) => queued_now.push(op.tag),
                Err(e) => {
                    failure.get_or_insert(e.to_string());
                    completions.push(Completion {
                        tag: op.tag,
                        result: -(libc::EIO as i64),
                    });
                }
            }
        }
        // Issue as many IOs as the depth, the rate, thinktime and fsync allow (one per pass on
        // an interleaving engine).
        let mut issued_this_pass = 0usize;
        more_to_issue = false;
        while !stopping && !exhausted && !sync_pending {
            let Some(&slot_idx) = free.last() else { break };
            if issued_this_pass >= issue_per_pass {
                more_to_issue = true;
                break;
            }
            issued_this_pass += 1;
            if let Some(t) = not_before {
                if now < t {
                    break;
                }
                not_before = None;
            }
            let intended = match next_intended {
                Some(t) if t > now => break,
                other => other,
            };
            let req = match deferred.take() {
                Some(r) => r,
                None => match generator.next() {
                    Some(r) => r,
                    None => {
                        exhausted = true;
                        break;
                    }
                },
            };
            if verifying && req.dir == Direction::Write && vstate.busy(req.file as u32, req.offset)
            {
                // Its intended time is not consumed: the wait counts in its latency.
                deferred = Some(req);
                break;
            }
            // A gated volume (cap, EBS model) takes the IO now and starts it when its bucket
            // admits it, in order: the IO counts as outstanding from now and its latency
            // includes the wait (slat), as on a throttled cloud volume where the application
            // sees deep queues and long latencies, not fewer IOs in flight.
            let mut admit_at = now;
            if let Some(g) = gate.as_mut() {
                let gate_now = (now - gate_origin).as_nanos() as u64;
                if let Admission::At(t) = g.admit(gate_now, req.dir, req.len) {
                    admit_at = gate_origin + Duration::from_nanos(t);
                }
                g.charge((admit_at - gate_origin).as_nanos() as u64, req.dir, req.len);
            }
            let outcome = match fault.as_mut() {
                Some(f) => f.on_issue((now - gate_origin).as_nanos() as u64, req.dir, req.len),
                None => Outcome::Deliver,
            };
            free.pop();
            let len = req.len as u32;
            let mut generation = 0;
            if verifying && req.dir == Direction::Write {
                generation = vstate.issue(req.file as u32, req.offset, len);
                verify::fill_block(
                    buffers.slice(slot_idx as usize, len as usize),
                    req.file as u32,
                    req.offset,
                    generation,
                    vstate.seed,
                );
            }
            slots[slot_idx as usize] = Some(Slot {
                dir: req.dir,
                file: req.file as u32,
                offset: req.offset,
                len,
                ready: now,
                submitted: now,
                intended,
                outcome,
                generation,
                stuck: None,
            });
            let fail_now = matches!(outcome, Outcome::FailEio | Outcome::DropWrite);
            if !fail_now {
                let op = IoOp {
                    dir: req.dir,
                    fd: if null { -1 } else { fds[req.file] },
                    file: req.file as u32,
                    offset: req.offset,
                    len,
                    buf: buffers.slot(slot_idx as usize),
                    tag: slot_idx,
                };
                if admit_at > now {
                    gated.push_back((admit_at, op));
                } else if let Err(e) = engine.queue(op) {
                    failure = Some(e.to_string());
                    free.push(slot_idx);
                    slots[slot_idx as usize] = None;
                    break;
                } else {
                    queued_now.push(slot_idx);
                    // fio's default iodepth_batch_submit=1: each IO goes to the device as soon
                    // as it is ready, so the first of a refill does not wait for the others'
                    // submission (an O_DIRECT submit does the block-layer work inline).
                    if queued_now.len() >= submit_batch {
                        if let Err(e) = engine.commit() {
                            failure = Some(e.to_string());
                        }
                        let t_sub = Instant::now();
                        for &s in &queued_now {
                            if let Some(slot) = slots[s as usize].as_mut() {
                                slot.submitted = t_sub;
                            }
                        }
                        queued_now.clear();
                    }
                }
            } else {
                // Faults that never reach the device complete "at once" below.
                let result = if matches!(outcome, Outcome::DropWrite) {
                    len as i64
                } else {
                    -(libc::EIO as i64)
                };
                completions.push(Completion {
                    tag: slot_idx,
                    result,
                });
                queued_now.push(slot_idx);
            }
            // The queue-depth integral is advanced at every change of the depth, so the
            // interval's mean outstanding IOs is exact (Little's law checks depend on it); the
            // top of the pass already brought it to `now`, the instant of this issue.
            debug_assert!(last_now >= now);
            inflight += 1;
            if measuring {
                stats.depth_hist[depth_bucket(inflight as u32)] += 1;
            }
            if let (Some(r), Some(_)) = (rate.as_mut(), intended) {
                next_intended = Some(rate_origin + Duration::from_nanos(r.next_intended_ns()));
            }
            if !job.thinktime.is_zero() {
                since_think += 1;
                if since_think >= job.thinktime_blocks.max(1) {
                    since_think = 0;
                    not_before = Some(now + job.thinktime);
                }
            }
            if req.dir == Direction::Write && sync_every > 0 {
                writes_since_sync += 1;
                if writes_since_sync >= sync_every {
                    writes_since_sync = 0;
                    sync_pending = true;
                }
            }
        }
        if !queued_now.is_empty() {
            if let Err(e) = engine.commit() {
                failure = Some(e.to_string());
            }
            let t_sub = Instant::now();
            for &s in &queued_now {
                if let Some(slot) = slots[s as usize].as_mut() {
                    slot.submitted = t_sub;
                }
            }
        }

        if inflight == 0 {
            if sync_pending {
                sync_pending = false;
                do_sync(job, &files, stats, measuring, &mut failure);
                continue;
            }
            if exhausted || stopping {
                break;
            }
            // Nothing in flight: wait for the next intended issue time or thinktime.
            let wake = [next_intended, not_before].into_iter().flatten().min();
            if let Some(w) = wake {
                let limit = (now + Duration::from_millis(50)).min(next_tick);
                sleep_until_unless_stopped(w.min(limit), stop);
            }
            continue;
        }

        if stopping && completions.is_empty() && seen.is_empty() {
            let since = *last_progress.get_or_insert(now);
            // A last look first: after a pause of this process (SIGSTOP, a VM freeze) the
            // completions may be there, only not yet seen.
            if now.saturating_duration_since(since) >= drain_limit
                && engine
                    .reap(0, Some(Duration::ZERO), &mut completions)
                    .is_ok_and(|()| completions.is_empty())
            {
                abandoned = inflight;
                let msg = give_up(
                    stats,
                    ctx.files,
                    &mut slots,
                    t0,
                    now,
                    deadline.map(|d| now.saturating_duration_since(d)),
                    drain_limit,
                );
                failure = Some(match failure.take() {
                    Some(f) => format!("{f}; then {msg}"),
                    None => msg,
                });
                break;
            }
        }
        if (more_to_issue && completions.is_empty()) || !seen.is_empty() {
            // Slots are free or completions are waiting to be handled: take what is visible
            // (no system call, no wait) and go on.
            if let Err(e) = engine.peek(&mut completions) {
                failure = Some(e.to_string());
            }
        } else {
            woke = true;
            reap_until_due(
                &mut *engine,
                &mut completions,
                &mut failure,
                due_wake(
                    stopping,
                    next_tick,
                    deadline,
                    (!sync_pending && !exhausted).then_some([next_intended, not_before]),
                    gated.front().map(|g| g.0),
                    held.iter().map(|h| h.0).min(),
                    last_progress.map(|t| t + drain_limit),
                ),
            );
        }
        // Completions are timestamped when seen. Coming out of a wait, an interleaving engine
        // handles only the first one before issuing again, so a slot is refilled at once
        // instead of after the bookkeeping of a whole burst (a virtio disk finishes ~31 IOs
        // per interrupt); the rest are handled on the next pass, with their own timestamps.
        // With fio's reaping this one clock read is also the instant the pass takes its
        // completions from `seen` (fio reads the clock once per reap too).
        let t_seen =
            (!completions.is_empty() || (!reap_all && !seen.is_empty())).then(Instant::now);
        let one_only = interleave && woke;
        woke = false;
        let (mut direct, mut queued, mut restamped);
        let all_now =
            seen.is_empty() && !one_only && (reap_all || completions.len() <= complete_max);
        if !reap_all && !all_now {
            carry_wait(
                &mut wait_area,
                &mut last_wait,
                seen.len(),
                t_seen.unwrap_or(now),
            );
        }
        let batch: &mut dyn Iterator<Item = (Completion, Instant)> = if all_now {
            // The usual case: everything seen now is handled now, with one timestamp; the
            // depth integral is carried to it once for the batch.
            let t = t_seen.unwrap_or(now);
            if t >= last_now {
                area += inflight as f64
                    * t.saturating_duration_since(last_now).as_nanos() as u64 as f64;
                last_now = t;
            }
            direct = completions.drain(..).map(move |c| (c, t));
            &mut direct
        } else {
            if let Some(t) = t_seen {
                seen.extend(completions.drain(..).map(|c| (c, t)));
            }
            let handle = if one_only {
                1
            } else if reap_all {
                seen.len()
            } else {
                complete_max
            }
            .min(seen.len());
            if reap_all {
                queued = seen.drain(..handle);
                &mut queued
            } else {
                // fio's clat ends when its loop takes the completion, not when the kernel
                // posted it: the wait in between is the job's.
                let t = t_seen.unwrap_or(now);
                restamped = seen.drain(..handle).map(move |(c, _)| (c, t));
                &mut restamped
            }
        };
        let stop_asked = stop.load(Ordering::Relaxed);
        for (c, t_done) in batch {
            let stopping_now = stop_asked || deadline.is_some_and(|d| t_done >= d);
            let Some(slot) = slots[c.tag as usize] else {
                continue;
            };
            // Added latency holds a completion until submission + delay; a stall holds every
            // completion until the stall ends. The IO stays outstanding meanwhile.
            let mut due = None;
            if let Outcome::DelayBy(ns) = slot.outcome {
                let d = slot.submitted + Duration::from_nanos(ns);
                if d > t_done {
                    due = Some(d);
                }
            }
            if let Some(f) = fault.as_ref() {
                if let Some(until) = f.stalled_until((t_done - gate_origin).as_nanos() as u64) {
                    let d = gate_origin + Duration::from_nanos(until);
                    due = Some(due.map_or(d, |x: Instant| x.max(d)));
                }
            }
            if let Some(d) = due.filter(|_| !stopping_now) {
                held.push((d, c));
                continue;
            }
            slots[c.tag as usize] = None;
            free.push(c.tag);
            if last_progress.is_some() {
                last_progress = Some(t_done);
            }
            // The depth integral: the depth drops at `t_done`. When the integral has already
            // been carried past it (the completion waited for its turn), the IO is taken out of
            // that stretch, within the current interval.
            if all_now {
                // Carried to `t_done` above.
            } else if t_done >= last_now {
                area += inflight as f64
                    * t_done.saturating_duration_since(last_now).as_nanos() as u64 as f64;
                last_now = t_done;
            } else {
                area -= last_now
                    .saturating_duration_since(t_done.max(last_tick))
                    .as_nanos() as u64 as f64;
            }
            inflight -= 1;
            if slot.generation > 0 {
                // A short write may have written part of the block: not acknowledged.
                let ok = c.result == slot.len as i64;
                let dropped = matches!(slot.outcome, Outcome::DropWrite);
                vstate.complete(slot.file, slot.offset, slot.generation, ok, dropped);
            }
            let took = t_done.saturating_duration_since(slot.ready).as_nanos() as u64;
            if stuck_ns > 0 && (took > stuck_ns || slot.stuck.is_some()) {
                note_stuck(stats, ctx.files, &slot, t0, took, true);
            }
            let d = &mut iv[slot.dir as usize];
            d.ios += 1;
            if c.result < 0 {
                d.errors += 1;
                if !goes_on(job, &mut stats.errors, slot.dir, c.result) && failure.is_none() {
                    failure = Some(io_failure(ctx.files, &slot, c.result));
                }
                continue;
            }
            if (c.result as u64) < slot.len as u64 {
                d.short_ios += 1;
            }
            d.bytes += c.result as u64;
            // lat is `took`; clat = lat - slat exactly, in whole nanoseconds (one clock
            // subtraction per IO fewer: they are a sixth of the loop's instructions).
            let slat = slot
                .submitted
                .saturating_duration_since(slot.ready)
                .as_nanos() as u64;
            let lat = took;
            let clat = lat.saturating_sub(slat);
            record(&mut d.slat, slat);
            d.saturated += record(&mut d.clat, clat) as u64;
            record(&mut d.lat, lat);
            if let (Some(h), Some(intended)) = (d.lat_intended.as_mut(), slot.intended) {
                record(
                    h,
                    t_done.saturating_duration_since(intended).as_nanos() as u64,
                );
            }
        }
    }

    let end = Instant::now();
    if measuring {
        area += inflight as f64 * end.saturating_duration_since(last_now).as_nanos() as u64 as f64;
        close_interval(
            ctx,
            stats,
            &mut iv,
            [&mut area, &mut wait_area],
            last_tick,
            end,
            timed_start,
        );
        stats.runtime = end - timed_start;
    }
    if failure.is_none() && job.end_fsync && !null {
        do_sync(job, &files, stats, measuring, &mut failure);
    }
    let ru = thread_rusage();
    stats.usr_cpu = tv(ru.ru_utime).saturating_sub(tv(ru_start.ru_utime));
    stats.sys_cpu = tv(ru.ru_stime).saturating_sub(tv(ru_start.ru_stime));
    stats.ctx = (ru.ru_nvcsw + ru.ru_nivcsw - ru_start.ru_nvcsw - ru_start.ru_nivcsw) as u64;
    stats.minf = (ru.ru_minflt - ru_start.ru_minflt) as u64;
    stats.majf = (ru.ru_majflt - ru_start.ru_majflt) as u64;
    report.started = SystemTime::now() - (end - timed_start);

    if abandoned > 0 {
        // The kernel still owns the IOs given up on: it may yet write into their buffers, and
        // closing, syncing, verifying or removing the files would wait on the same device (a
        // FUSE close sends a flush). So the engine, the buffers and the open files are left to
        // the process, a bounded leak per clone, and the files stay where they are.
        std::mem::forget(engine);
        std::mem::forget(buffers);
        std::mem::forget(files);
        if let Some(h) = checkpointing.take() {
            drop(h); // detached: it may be writing to the same device
        }
        report.abandoned = ctx.files.iter().map(|f| f.path.clone()).collect();
        if verifying && !vstate.blocks.is_empty() {
            report.verify = Some(VerifyReport {
                errors: vec![format!(
                    "not verified: {abandoned} IO(s) never completed (the device stopped answering)"
                )],
                ..Default::default()
            });
        }
        return Err(failure.unwrap_or_default());
    }
    // The ring goes before the buffers it registered.
    drop(engine);
    // The final state must not be overwritten by a checkpoint still being written.
    if let Some(h) = checkpointing.take() {
        let _ = h.join();
    }
    if verifying && !vstate.blocks.is_empty() {
        let names: Vec<String> = ctx.files.iter().map(|f| absolute(&f.path)).collect();
        let mut r = if stop.load(Ordering::Relaxed) {
            VerifyReport {
                errors: vec!["stopped before verification".into()],
                ..Default::default()
            }
        } else {
            verify::check(&vstate, &files, &names)
        };
        if let Some(first) = ctx.files.first() {
            let sp = verify::state_path(&first.path, &job.name, ctx.clone);
            match verify::save(&first.scope, &sp, &job.name, ctx.clone, &names, &vstate) {
                Ok(()) => r.state_files.push(absolute(&sp)),
                Err(e) => r.errors.push(format!("saving the verify state: {e}")),
            }
        }
        if r.bad() > 0 && failure.is_none() && !verify_goes_on(job, &mut stats.errors, r.bad()) {
            let first: Vec<String> = r
                .findings
                .iter()
                .take(10)
                .map(|f| format!("{}@{}: {:?}", f.file, f.offset, f.kind))
                .collect();
            failure = Some(format!(
                "verify (crc32c) failed on {} of {} blocks of job '{}': {}",
                r.bad(),
                r.blocks,
                job.name,
                first.join(", ")
            ));
        }
        report.verify = Some(r);
    }
    match failure {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

fn absolute(p: &std::path::Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

/// The next instant the loop must act at on its own: an interval tick, the deadline, an issue
/// time (rate, thinktime; `None` when no IO may be issued now), a gated IO or a held completion.
///
/// Once stopping, the loop only waits for the IOs in flight, so the deadline (by then past) no
/// longer bounds the wait: it turned every wait of the drain into a poll, which spun for the
/// longest IO's latency (120 ms and ~1,200 system calls after a run of 16 MiB reads).
///
/// `give_up`: while draining, when the IOs still in flight will be given up on.
fn due_wake(
    stopping: bool,
    next_tick: Instant,
    deadline: Option<Instant>,
    issue: Option<[Option<Instant>; 2]>,
    gated: Option<Instant>,
    held: Option<Instant>,
    give_up: Option<Instant>,
) -> Instant {
    let deadline = deadline.filter(|_| !stopping);
    let mut wake = deadline.map_or(next_tick, |d| d.min(next_tick));
    for t in issue
        .into_iter()
        .flatten()
        .flatten()
        .chain(gated)
        .chain(held)
        .chain(give_up)
    {
        wake = wake.min(t);
    }
    wake
}

/// Reap: block for one completion (none when some are already waiting to be processed), bounded
/// by `wake`, the next thing the loop must do on time.
fn reap_until_due(
    engine: &mut dyn engine::Engine,
    completions: &mut Vec<Completion>,
    failure: &mut Option<String>,
    wake: Instant,
) {
    let timeout = wake.saturating_duration_since(Instant::now());
    let need_wait = completions.is_empty();
    let res = if need_wait && timeout.is_zero() {
        // Due now: poll without blocking.
        engine.reap(0, Some(Duration::ZERO), completions)
    } else {
        engine.reap(
            if need_wait { 1 } else { 0 },
            Some(timeout.max(Duration::from_micros(1))),
            completions,
        )
    };
    if let Err(e) = res {
        *failure = Some(e.to_string());
    }
}

/// How long fio waits for a job that does not exit after its end before it gives up on it
/// (`FIO_REAP_TIMEOUT`, 300 s): the drain's limit when `stuck_timeout=0` turns the list off.
const FIO_REAP_TIMEOUT: Duration = Duration::from_secs(300);

/// Gives up on the IOs still in flight after the job's end: each is listed as stuck, not
/// completed, and the returned message says how many, for how long and what it means.
fn give_up(
    stats: &mut JobStats,
    files: &[PlannedFile],
    slots: &mut [Option<Slot>],
    t0: Instant,
    now: Instant,
    past_end: Option<Duration>,
    quiet_for: Duration,
) -> String {
    let mut n = 0;
    for s in slots.iter_mut().flatten() {
        let age = now.saturating_duration_since(s.ready).as_nanos() as u64;
        s.stuck = Some(note_stuck(stats, files, s, t0, age, false));
        n += 1;
    }
    let mut names: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
    names.dedup();
    format!(
        "the device stopped answering: {n} IO(s) still in flight {:.1} s after the job's end, none \
         completed for {:.1} s (stuck_timeout); gave up waiting for them (listed as stuck IOs). \
         Files left in place: {}",
        past_end.unwrap_or_default().as_secs_f64(),
        quiet_for.as_secs_f64(),
        names.join(", ")
    )
}

/// Lists (or updates) a stuck IO; returns its index in the list (`u32::MAX`: counted, not
/// listed, the list being full).
fn note_stuck(
    stats: &mut JobStats,
    files: &[PlannedFile],
    slot: &Slot,
    t0: Instant,
    took_ns: u64,
    completed: bool,
) -> u32 {
    let latency_ms = took_ns / 1_000_000;
    if let Some(i) = slot.stuck {
        if let Some(s) = stats.stuck.get_mut(i as usize) {
            s.latency_ms = latency_ms;
            s.completed = completed;
        }
        return i;
    }
    stats.stuck_count += 1;
    if stats.stuck.len() >= STUCK_LIMIT {
        return u32::MAX;
    }
    stats.stuck.push(StuckIo {
        file: files
            .get(slot.file as usize)
            .map(|f| f.path.display().to_string())
            .unwrap_or_default(),
        offset: slot.offset,
        len: slot.len,
        direction: slot.dir,
        start_ms: slot.ready.saturating_duration_since(t0).as_millis() as u64,
        latency_ms,
        completed,
    });
    (stats.stuck.len() - 1) as u32
}

fn rate_ios_per_sec(job: &JobSpec) -> Option<f64> {
    if !job.rate.is_limited() {
        return None;
    }
    let mean_bs = |d: usize| -> f64 {
        let w: f64 = job.bs[d]
            .iter()
            .map(|&(_, p)| p as f64)
            .sum::<f64>()
            .max(1.0);
        job.bs[d]
            .iter()
            .map(|&(s, p)| s as f64 * p as f64)
            .sum::<f64>()
            / w
    };
    let share = |d: usize| -> f64 {
        let r = job.rwmixread as f64 / 100.0;
        match (job.pattern.reads(), job.pattern.writes(), d) {
            (true, true, 0) => r,
            (true, true, _) => 1.0 - r,
            (true, false, 0) | (false, true, 1) => 1.0,
            _ => 0.0,
        }
    };
    // Each direction's limit, turned into a limit on the job's total IO rate given the mix.
    let mut total: Option<f64> = None;
    for d in 0..2 {
        let per_dir = match (job.rate.iops[d], job.rate.bytes_per_sec[d]) {
            (Some(i), _) => Some(i as f64),
            (None, Some(b)) => Some(b as f64 / mean_bs(d)),
            _ => None,
        };
        if let Some(r) = per_dir {
            if share(d) > 0.0 {
                let t = r / share(d);
                total = Some(total.map_or(t, |x: f64| x.min(t)));
            }
        }
    }
    total
}

/// Carries the integral of finished IOs waiting to be handled (`waiting` of them since `last`)
/// to `to`.
fn carry_wait(area: &mut f64, last: &mut Instant, waiting: usize, to: Instant) {
    *area += waiting as f64 * to.saturating_duration_since(*last).as_nanos() as u64 as f64;
    *last = (*last).max(to);
}

/// `areas`: the integrals over the interval of IOs in flight and of finished IOs waiting to
/// be handled (IO·ns); both are reset for the next interval.
fn close_interval(
    ctx: &CloneCtx<'_>,
    stats: &mut JobStats,
    iv: &mut [DirStats; 2],
    areas: [&mut f64; 2],
    start: Instant,
    end: Instant,
    timed_start: Instant,
) {
    let len = end - start;
    let [area, wait_area] = areas;
    let mean = |a: f64| {
        if len.is_zero() {
            0.0
        } else {
            a / len.as_nanos() as f64
        }
    };
    let summary = IntervalSummary {
        end: end - timed_start,
        len,
        ios: [iv[0].ios, iv[1].ios],
        bytes: [iv[0].bytes, iv[1].bytes],
        errors: [iv[0].errors, iv[1].errors],
        outstanding: mean(*area),
        waiting: mean(*wait_area),
    };
    let live = &ctx.opts.live;
    for d in 0..2 {
        live.ios[d].fetch_add(iv[d].ios, Ordering::Relaxed);
        live.bytes[d].fetch_add(iv[d].bytes, Ordering::Relaxed);
        live.errors.fetch_add(iv[d].errors, Ordering::Relaxed);
    }
    if let Some(sink) = &ctx.opts.sink {
        sink.on_interval(IntervalSnapshot {
            index: stats.intervals.len(),
            job_index: ctx.job_index,
            job_name: &ctx.job.name,
            clone: ctx.clone,
            summary: &summary,
            dirs: iv,
        });
    }
    stats.dirs[0].merge(&iv[0]);
    stats.dirs[1].merge(&iv[1]);
    stats.intervals.push(summary);
    iv[0].reset();
    iv[1].reset();
    *area = 0.0;
    *wait_area = 0.0;
}

fn do_sync(
    job: &JobSpec,
    files: &[File],
    stats: &mut JobStats,
    measuring: bool,
    failure: &mut Option<String>,
) {
    for f in files {
        let t = Instant::now();
        let r = if job.fdatasync > 0 && job.fsync == 0 {
            f.sync_data()
        } else {
            f.sync_all()
        };
        if let Err(e) = r {
            failure.get_or_insert_with(|| format!("fsync failed: {e}"));
        }
        if measuring {
            stats.sync.ios += 1;
            record(&mut stats.sync.lat, t.elapsed().as_nanos() as u64);
        }
    }
}

/// Puts the thread back on its scheduling policy when dropped (after the first IOs went out).
pub struct RestorePolicy {
    policy: i32,
    param: libc::sched_param,
}

impl Drop for RestorePolicy {
    fn drop(&mut self) {
        // SAFETY: restoring this thread's own policy, read before it was changed.
        unsafe {
            libc::pthread_setschedparam(libc::pthread_self(), self.policy, &self.param);
        }
    }
}

/// Waits for an instant of the system clock (not the monotonic one: the coordinator's start
/// instant is expressed in wall-clock time).
///
/// Far from the instant it sleeps in 50 ms steps (to notice a stop). The last stretch is an
/// absolute `clock_nanosleep` on CLOCK_REALTIME with 1 ns timer slack, under SCHED_FIFO when the
/// agent may use it (root, CAP_SYS_NICE): a real-time thread that wakes preempts ordinary ones at
/// once, so many agents (or clones) on few cores all start within the kernel's wake-up latency
/// instead of waiting for a time slice. The policy is restored as soon as the thread wakes:
/// the IO itself runs as an ordinary thread. Without the privilege it sleeps to 300 µs before
/// the instant and spins the rest.
pub fn wait_until_realtime(at: SystemTime, stop: &AtomicBool) -> Option<RestorePolicy> {
    const SPIN: Duration = Duration::from_micros(300);
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
    let sleep_until = |t: SystemTime| {
        let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let ts = libc::timespec {
            tv_sec: since.as_secs() as libc::time_t,
            tv_nsec: since.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_REALTIME,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        }
    };
    loop {
        let left = match at.duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => d,
            _ => return None,
        };
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        if left > Duration::from_millis(60) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        break;
    }
    // SAFETY: querying and setting this thread's own scheduling policy.
    let (policy, param) = unsafe {
        let mut param: libc::sched_param = std::mem::zeroed();
        let mut policy = 0;
        libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut param);
        (policy, param)
    };
    let fifo = libc::sched_param { sched_priority: 1 };
    // SAFETY: as above; fails harmlessly without the privilege.
    let realtime =
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &fifo) } == 0;
    if realtime {
        while sleep_until(at) == libc::EINTR {}
        return Some(RestorePolicy { policy, param });
    }
    if let Some(wake) = at.checked_sub(SPIN) {
        while SystemTime::now() < wake && sleep_until(wake) == libc::EINTR {}
    }
    while SystemTime::now() < at && !stop.load(Ordering::Relaxed) {
        std::hint::spin_loop();
    }
    None
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    sleep_until_unless_stopped(Instant::now() + d, stop)
}

/// Sleeps until `t` in slices short enough to notice a stop request within 50 ms; the last
/// stretch spins briefly so that open-loop issue times are kept to microseconds.
fn sleep_until_unless_stopped(t: Instant, stop: &AtomicBool) {
    loop {
        let now = Instant::now();
        if now >= t || stop.load(Ordering::Relaxed) {
            return;
        }
        let left = t - now;
        if left > Duration::from_micros(200) {
            std::thread::sleep((left - Duration::from_micros(100)).min(Duration::from_millis(50)));
        } else {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
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

    /// Jobs that did not come from a job file (built in code, or edited after parsing) meet the
    /// same limits before anything is planned or written.
    #[test]
    fn validate_bounds_clones_and_depth() {
        let origin = crate::job::Origin {
            file: "t.fio".into(),
            line: 3,
        };
        let mut j = JobSpec::with_defaults("j", origin);
        j.iodepth = 100_000;
        let e = validate(&j).unwrap_err().to_string();
        assert!(
            e.contains("t.fio:3") && e.contains("iodepth=100000: at most 65536"),
            "{e}"
        );
        j.iodepth = 1;
        j.numjobs = 100_000;
        let e = validate(&j).unwrap_err().to_string();
        assert!(e.contains("numjobs=100000: at most 4096"), "{e}");
        j.numjobs = 1;
        j.engine = EngineKind::IoUring;
        j.iodepth = 40_000;
        let e = validate(&j).unwrap_err().to_string();
        assert!(
            e.contains("iodepth=40000: at most 32768 with ioengine=io_uring"),
            "{e}"
        );
    }

    /// The gRPC fuzz test drove a run into iodepth x bs buffers of many GiB (bs=1g); under a
    /// memory limit such an allocation fails, and that failure (or an overflow of the size)
    /// panicked the clone, which took the agent's whole run down with it. Now the clone fails
    /// with a message.
    #[test]
    fn impossible_io_buffers_are_an_error_not_a_panic() {
        for (slots, slot_len) in [(usize::MAX / 4096 + 1, 4096), (1 << 20, 1 << 30)] {
            let err = Buffers::new(slots, slot_len, 1)
                .err()
                .expect("no such allocation");
            assert!(
                err.contains("do not fit in memory") || err.contains("cannot allocate"),
                "{err}"
            );
        }
        let b = Buffers::new(2, 1, 1).expect("two 4 KiB slots");
        assert_eq!(b.slot_len, 4096);
    }

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
}
