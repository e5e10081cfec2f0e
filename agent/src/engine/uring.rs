//! io_uring engine: one ring per job, sized to the job's iodepth.
//!
//! Set up and driven as fio's io_uring engine: COOP_TASKRUN and DEFER_TASKRUN rings, so
//! completions are run when this thread enters the kernel for events, not by interrupting it;
//! every submit carries IORING_ENTER_GETEVENTS, so it also runs the completion work pending since
//! the last one and the completion queue can then be read without a system call (`peek`). A
//! wait for completions happens only when nothing is visible.
//!
//! Unlike fio's default, the job's files and its buffer allocation are registered with the ring
//! (fio's `registerfiles=1 fixedbufs=1`): without that, the kernel looks up the file and pins
//! the buffer's pages on every O_DIRECT IO, on the job thread, between a completion and the IO
//! that replaces it. A kernel or a memlock limit that refuses either leaves that part
//! unregistered (the job runs as before); `fixedbufs=0` / `registerfiles=0` turn them off for a
//! like-for-like comparison with fio's default. No SQPOLL: on a small machine its polling thread
//! takes the CPU the job threads need.

use std::time::Duration;

use io_uring::{IoUring, opcode, types};

use super::{Capabilities, Completion, Engine, EngineError, IoOp, Registered, Resources};
use crate::job::Direction;

/// The kernel refuses to register a buffer larger than this (io_buffer_validate: SZ_1G).
const MAX_FIXED_BUFFER: usize = 1 << 30;

/// `IORING_ENTER_GETEVENTS` from linux/io_uring.h (not exported by the libc crate).
const IORING_ENTER_GETEVENTS: u32 = 1;

pub struct UringEngine {
    ring: IoUring,
    /// Entries pushed to the submission queue but not yet handed to the kernel.
    pending: usize,
    registered: Registered,
}

impl UringEngine {
    pub fn new(depth: u32, resources: &Resources<'_>) -> Result<Self, EngineError> {
        // Checked here, not left to the kernel: its EINVAL for a too-large ring would read as
        // "io_uring unavailable" and fall back to a thread per IO in flight.
        let (max, why) = crate::limits::max_depth(crate::job::EngineKind::IoUring);
        if depth > max {
            return Err(EngineError::TooDeep {
                engine: "io_uring",
                depth,
                max,
                why,
            });
        }
        let entries = depth.max(1).next_power_of_two();
        // Completions are run in this thread when it asks for them (DEFER_TASKRUN, with
        // COOP_TASKRUN), not by interrupting it: fewer context switches per IO, as fio sets up
        // its rings. Older kernels refuse the flags; then a plain ring.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_defer_taskrun()
            .build(entries)
            .or_else(|_| IoUring::builder().setup_single_issuer().build(entries))
            .or_else(|_| IoUring::new(entries))
            .map_err(EngineError::UringUnavailable)?;
        let registered = register(&ring, resources);
        Ok(UringEngine {
            ring,
            pending: 0,
            registered,
        })
    }

    fn sys(op: &'static str, source: std::io::Error) -> EngineError {
        EngineError::Sys {
            engine: "io_uring",
            op,
            source,
        }
    }

    fn drain(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        for cqe in self.ring.completion() {
            out.push(Completion {
                tag: cqe.user_data() as u32,
                result: cqe.result() as i64,
            });
            n += 1;
        }
        n
    }
}

impl Engine for UringEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "io_uring",
            concurrent: true,
            touches_files: true,
            interleave: true,
        }
    }

    fn queue(&mut self, op: IoOp) -> Result<(), EngineError> {
        // One arm per (file, buffer) registration: the opcode builders take the file as a
        // sealed generic, so the two kinds of file reference cannot share a variable.
        macro_rules! rw {
            ($fd:expr) => {
                match (op.dir, self.registered.buffers) {
                    (Direction::Read, true) => opcode::ReadFixed::new($fd, op.buf, op.len, 0)
                        .offset(op.offset)
                        .build(),
                    (Direction::Write, true) => opcode::WriteFixed::new($fd, op.buf, op.len, 0)
                        .offset(op.offset)
                        .build(),
                    (Direction::Read, false) => opcode::Read::new($fd, op.buf, op.len)
                        .offset(op.offset)
                        .build(),
                    (Direction::Write, false) => opcode::Write::new($fd, op.buf, op.len)
                        .offset(op.offset)
                        .build(),
                }
            };
        }
        let entry = if self.registered.files {
            rw!(types::Fixed(op.file))
        } else {
            rw!(types::Fd(op.fd))
        }
        .user_data(op.tag as u64);
        // SAFETY: the buffer stays valid until the completion is reaped (IoOp's contract).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // The queue is sized to the depth, so this only happens if the runner over-queues;
            // flush and retry rather than lose the op.
            self.commit()?;
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| Self::sys("queue", std::io::Error::other("submission queue full")))?;
        }
        self.pending += 1;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), EngineError> {
        while self.pending > 0 {
            // GETEVENTS with min_complete 0 never waits; with DEFER_TASKRUN it posts the
            // completions that finished since the last enter, so the runner sees them with
            // `peek` right after this submit (fio's commit does the same).
            // SAFETY: no argument pointer; to_submit counts entries pushed (and synced) above.
            let res = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    self.pending as u32,
                    0,
                    IORING_ENTER_GETEVENTS,
                    None,
                )
            };
            match res {
                Ok(n) => self.pending -= n.min(self.pending),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // Completion queue overflow protection: the caller must reap first.
                    break;
                }
                Err(e) => return Err(Self::sys("submit", e)),
            }
        }
        Ok(())
    }

    fn peek(&mut self, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        // Completions finished before the last enter are already in the queue; later ones are
        // posted by the next submit or wait.
        self.drain(out);
        Ok(())
    }

    fn reap(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<(), EngineError> {
        let mut got = self.drain(out);
        if min == 0 && got == 0 {
            // A poll: with deferred task work, completions only appear when the thread enters
            // the kernel asking for events, so ask, without waiting.
            let ts = types::Timespec::new();
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(n) => self.pending -= n.min(self.pending),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::ETIME)) => {}
                Err(e) => return Err(Self::sys("poll", e)),
            }
            self.drain(out);
            return Ok(());
        }
        while got < min {
            let want = min - got;
            let res = match timeout {
                None => self.ring.submitter().submit_and_wait(want),
                Some(t) => {
                    let ts = types::Timespec::new()
                        .sec(t.as_secs())
                        .nsec(t.subsec_nanos());
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(want, &args)
                }
            };
            match res {
                Ok(n) => self.pending -= n.min(self.pending),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {
                    self.drain(out);
                    return Ok(());
                }
                Err(e) => return Err(Self::sys("wait", e)),
            }
            got += self.drain(out);
            if timeout.is_some() {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Registers what the runner lent (see `Resources`), each part only if asked and only if the
/// kernel accepts it: an old kernel (EINVAL), a memlock limit below the buffers (ENOMEM) or a
/// file type that cannot be registered leaves that part to per-IO lookups, which cost CPU but
/// measure the same thing.
fn register(ring: &IoUring, resources: &Resources<'_>) -> Registered {
    let mut done = Registered::default();
    let fds = resources.fds;
    if resources.register.files && !fds.is_empty() && fds.iter().all(|&fd| fd >= 0) {
        match ring.submitter().register_files(fds) {
            Ok(()) => done.files = true,
            Err(e) => tracing::debug!("io_uring: files not registered ({e}); per-IO lookups"),
        }
    }
    let wanted = |&(_, len): &(*mut u8, usize)| {
        resources.register.buffers && len > 0 && len <= MAX_FIXED_BUFFER
    };
    if let Some((base, len)) = resources.buffers.filter(wanted) {
        let iov = libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        };
        // SAFETY: the runner keeps the allocation alive and in place for the life of the
        // engine (`Resources`); the kernel also holds its own reference to the pages.
        match unsafe { ring.submitter().register_buffers(&[iov]) } {
            Ok(()) => done.buffers = true,
            Err(e) => tracing::debug!(
                "io_uring: {len} bytes of buffers not registered ({e}); pinned per IO"
            ),
        }
    }
    done
}
