//! One job clone on its own thread: set-up before the start barrier, the start itself, then
//! the IO loop (`io_loop`) and the end of its run.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::buffers::Buffers;
use super::clock::{sleep_unless_stopped, wait_until_realtime};
use super::group::StartBarrier;
use super::io_loop::IoLoop;
use super::{CloneFaults, RunOptions};
use crate::engine::{self, Engine};
use crate::job::{EngineKind, JobSpec};
use crate::layout::{self, PlannedFile};
use crate::rate::RateScheduler;
use crate::report::JobReport;
use crate::stats::JobStats;
use crate::verify::{self, VerifyState};
use crate::workload::{Generator, WorkloadParams};
use lockstep_core::confine::Scope;

pub(super) struct CloneCtx<'a> {
    pub(super) job: &'a JobSpec,
    pub(super) job_index: usize,
    pub(super) clone: u32,
    pub(super) groupid: u32,
    pub(super) files: &'a [PlannedFile],
    pub(super) seed: u64,
    pub(super) barrier: Arc<StartBarrier>,
    pub(super) opts: &'a RunOptions,
    pub(super) faults: CloneFaults,
}

/// What a clone opens, allocates and builds before the start barrier, so that none of it
/// delays a synchronized start.
pub(super) struct CloneIo {
    pub(super) files: Vec<File>,
    pub(super) fds: Vec<i32>,
    pub(super) generator: Generator,
    pub(super) engine: Box<dyn Engine>,
    pub(super) rate: Option<RateScheduler>,
    pub(super) buffers: Buffers,
    /// The verify state, sized from the layout (empty when the clone does not verify).
    pub(super) vstate: VerifyState,
}

pub(super) fn run_clone(mut ctx: CloneCtx<'_>) -> JobReport {
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
    // Set-up errors must still release the barrier, or the rest of the group waits forever.
    let enter = ctx.faults.enter.take();
    let setup = set_up(ctx, enter);
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
    let io = setup?;
    if !job.startdelay.is_zero() {
        sleep_unless_stopped(job.startdelay, &ctx.opts.stop);
    }
    let gate = ctx.faults.gate.take();
    let fault = ctx.faults.fault.take();
    let mut mirror = ctx.faults.mirror.take();
    if let Some(m) = mirror.as_mut() {
        m.files(ctx.files);
    }
    let mut io_loop = IoLoop::new(ctx, report, io, gate, fault);
    io_loop.mirror = mirror;
    io_loop.run();
    io_loop.finish()
}

type Enter = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// Opens the clone's files, builds its generator, rate schedule, buffers and engine.
pub(super) fn set_up(ctx: &CloneCtx<'_>, enter: Option<Enter>) -> Result<CloneIo, String> {
    let job = ctx.job;
    let depth = job.iodepth.max(1) as usize;
    let null = job.engine == EngineKind::Null;
    let writes = job.pattern.writes();
    if let Some(enter) = enter {
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
    let vstate = if job.verify.is_some() && !null {
        verify_state(ctx)?
    } else {
        VerifyState::new(ctx.seed)
    };
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
    let engine = engine::build(job.engine, depth as u32, &resources).map_err(|e| e.to_string())?;
    Ok(CloneIo {
        files,
        fds,
        generator,
        engine,
        rate,
        buffers,
        vstate,
    })
}

/// A verifying clone's state, one word per block of its files' regions. A table too large
/// for memory goes beside the clone's first file, through the volume's scope; a volume that
/// is one file or device (`Scope::Exact`) has no room of ours, so its table stays in memory.
fn verify_state(ctx: &CloneCtx<'_>) -> Result<VerifyState, String> {
    let job = ctx.job;
    let regions: Vec<(u64, u64)> = ctx
        .files
        .iter()
        .map(|f| (f.region.offset, f.region.len))
        .collect();
    let layout = verify::Layout::new(job.min_bs() as u32, &regions);
    let spill = ctx
        .files
        .first()
        .filter(|f| !matches!(f.scope, Scope::Exact(_)))
        .map(|f| verify::Spill {
            scope: f.scope.clone(),
            path: verify::table_path(&f.path, &job.name, ctx.clone),
        });
    let bytes = layout.table_bytes();
    VerifyState::for_layout(
        ctx.seed,
        layout,
        spill.as_ref(),
        ctx.opts.verify_memory_limit,
    )
    .map_err(|e| {
        let at = spill.map_or(String::new(), |s| format!(" at {}", s.path.display()));
        format!(
            "verify: the state table of job '{}' ({bytes} bytes, 8 per block) could not be made{at}: {e}",
            job.name
        )
    })
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

/// Per-thread resource usage, for fio's cpu line.
pub(super) fn thread_rusage() -> libc::rusage {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    }
}

pub(super) fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000)
}
