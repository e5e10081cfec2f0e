//! The engine contract: queue, commit, reap. One implementation per file.
//!
//! Like fio's ioengines (queue → commit → getevents), but small: an engine never sees the job,
//! only operations on file descriptors and buffers the runner owns. What an engine can do is
//! data (`Capabilities`), not extra hooks.
//!
//! - `uring`: io_uring, one ring per job; runs `ioengine=io_uring` and `ioengine=libaio` (same
//!   iodepth semantics: up to iodepth IOs in flight, submitted in batches).
//! - `threads`: the portable fallback: pread/pwrite, inline for iodepth 1 (fio's psync) or on
//!   iodepth worker threads; chosen automatically where io_uring is unavailable.
//! - `null`: completes every IO at once without touching a device, to measure lockstep itself.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::job::{Direction, EngineKind};
use crate::limits;

pub mod null;
pub mod threads;
pub mod uring;

/// One IO for the engine. The buffer belongs to the runner and stays valid and untouched until
/// the IO's completion is reaped: that is the contract that makes the raw pointer sound.
#[derive(Debug, Clone, Copy)]
pub struct IoOp {
    pub dir: Direction,
    pub fd: RawFd,
    /// The file's index in `Resources::fds`: engines that registered the files use it instead
    /// of `fd`.
    pub file: u32,
    pub offset: u64,
    pub len: u32,
    pub buf: *mut u8,
    /// The runner's slot index, returned with the completion.
    pub tag: u32,
}

// SAFETY: the buffer is owned by the runner for the life of the op (see `IoOp`); worker threads
// of the `threads` engine only touch it between queue and reap.
unsafe impl Send for IoOp {}

/// A finished IO: bytes transferred, or a negative errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub tag: u32,
    pub result: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Name as reported (e.g. "io_uring", "psync", "null").
    pub name: &'static str,
    /// Whether several IOs can really be in flight at once.
    pub concurrent: bool,
    /// Whether IOs touch a real file (false for null).
    pub touches_files: bool,
    /// Whether the runner should interleave: issue one IO, look at the completions that are
    /// already visible (`peek`, no system call), issue the next. Set where every submit enters
    /// the kernel anyway and makes finished completions visible on the way (io_uring's commit
    /// runs the deferred completion work), as fio does with its defaults
    /// (iodepth_batch_submit=1, iodepth_batch_complete_max=1): a completion is seen and its
    /// replacement issued one submit later, instead of after the whole refill of a batch.
    pub interleave: bool,
}

/// Which of the job's files and buffers are (to be) registered with the kernel for the whole
/// job (io_uring's registered files and fixed buffers, fio's `registerfiles=1 fixedbufs=1`), so
/// an IO neither looks its file up nor pins its buffer's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registered {
    pub files: bool,
    pub buffers: bool,
}

/// What the runner lends an engine for the life of a job: its open files, in the order of
/// `IoOp::file`, and its one buffer allocation, which every `IoOp::buf` points into. An engine
/// that can hand them to the kernel once does (io_uring); the others ignore them.
#[derive(Debug, Clone, Copy)]
pub struct Resources<'a> {
    pub fds: &'a [RawFd],
    /// Start and length of the buffer allocation; None when there is none worth registering.
    pub buffers: Option<(*mut u8, usize)>,
    /// Whether to register at all (job option `fixedbufs`/`registerfiles` = 0 turns each off).
    pub register: Registered,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "io_uring is not available on this kernel or is blocked by policy ({0}); use ioengine=psync or let lockstep fall back"
    )]
    UringUnavailable(io::Error),
    #[error("engine {engine}: {op} failed: {source}")]
    Sys {
        engine: &'static str,
        op: &'static str,
        source: io::Error,
    },
    #[error("engine {0}: worker threads stopped unexpectedly")]
    WorkersGone(&'static str),
    /// A queue deeper than the engine can run (see `limits::max_depth`).
    #[error("engine {engine}: iodepth={depth} is too deep: at most {max} ({why}); lower iodepth")]
    TooDeep {
        engine: &'static str,
        depth: u32,
        max: u32,
        why: &'static str,
    },
    /// io_uring is unavailable and the depth is too deep for the pread/pwrite fallback.
    #[error(
        "io_uring is not available on this kernel or is blocked by policy ({source}), and the \
         pread/pwrite fallback runs at most {max} IOs in flight (one thread each), not \
         iodepth={depth}; lower iodepth to {max} or allow io_uring"
    )]
    NoFallback {
        source: io::Error,
        depth: u32,
        max: u32,
    },
}

/// The small contract every engine fills.
pub trait Engine: Send {
    fn capabilities(&self) -> Capabilities;
    /// Queue an op; it reaches the device at the next `commit` (or earlier, for sync engines).
    /// The runner never queues more than the depth the engine was built for.
    fn queue(&mut self, op: IoOp) -> Result<(), EngineError>;
    /// Hand every queued op to the device.
    fn commit(&mut self) -> Result<(), EngineError>;
    /// Append completions to `out`: wait for at least `min` of them, but no longer than
    /// `timeout` (None: no limit). Returning fewer than `min` means the timeout passed.
    fn reap(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<(), EngineError>;
    /// Append the completions that are visible now, without waiting; engines that can tell
    /// without a system call do not make one.
    fn peek(&mut self, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        self.reap(0, Some(Duration::ZERO), out)
    }
}

/// Builds the engine for a job. io_uring (asked for as io_uring or libaio) falls back to worker
/// threads when the kernel refuses a ring, with a warning, as the issue asks: a job file written
/// for libaio must still run where io_uring is disabled (e.g. by seccomp in containers).
pub fn build(
    kind: EngineKind,
    depth: u32,
    resources: &Resources<'_>,
) -> Result<Box<dyn Engine>, EngineError> {
    match kind {
        EngineKind::Null => Ok(Box::new(null::NullEngine::new(depth))),
        EngineKind::Psync => Ok(Box::new(threads::ThreadEngine::new(depth)?)),
        EngineKind::IoUring | EngineKind::Libaio => match uring::UringEngine::new(depth, resources)
        {
            Ok(engine) => Ok(Box::new(engine)),
            Err(EngineError::UringUnavailable(source)) if depth > limits::MAX_SYNC_WORKERS => {
                Err(EngineError::NoFallback {
                    source,
                    depth,
                    max: limits::MAX_SYNC_WORKERS,
                })
            }
            Err(EngineError::UringUnavailable(err)) => {
                tracing::warn!(
                    "io_uring unavailable ({err}); falling back to pread/pwrite on {depth} worker threads"
                );
                Ok(Box::new(threads::ThreadEngine::new(depth)?))
            }
            Err(other) => Err(other),
        },
    }
}

/// Whether this kernel lets us make an io_uring (seccomp, sysctl io_uring_disabled, old kernel).
pub fn uring_available() -> bool {
    io_uring::IoUring::new(2).is_ok()
}

/// Runs one pread/pwrite and returns bytes or -errno, the result convention of `Completion`.
pub(crate) fn sync_rw(op: &IoOp) -> i64 {
    // SAFETY: the runner guarantees `buf` points to at least `len` bytes it owns until reaped.
    let r = unsafe {
        match op.dir {
            Direction::Read => libc::pread(op.fd, op.buf.cast(), op.len as usize, op.offset as i64),
            Direction::Write => {
                libc::pwrite(op.fd, op.buf.cast(), op.len as usize, op.offset as i64)
            }
        }
    };
    if r < 0 {
        -(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO) as i64)
    } else {
        r as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_URING_DEPTH;

    /// The kernel refuses rings over IORING_MAX_ENTRIES; that refusal is not "io_uring is
    /// unavailable", and must not become one pread/pwrite thread per IO in flight.
    #[test]
    fn io_uring_deeper_than_the_kernel_allows_is_refused_not_run_on_threads() {
        let resources = Resources {
            fds: &[],
            buffers: None,
            register: Registered::default(),
        };
        for kind in [EngineKind::IoUring, EngineKind::Libaio] {
            let e = build(kind, MAX_URING_DEPTH + 1, &resources)
                .err()
                .expect("a depth over the ring limit is refused");
            let text = e.to_string();
            assert!(text.contains("at most 32768"), "{text}");
        }
    }
}
