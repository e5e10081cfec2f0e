//! io_uring engine: one ring per job, sized to the job's iodepth.
//!
//! Set up and driven as fio's io_uring engine: COOP_TASKRUN and DEFER_TASKRUN rings, so
//! completions are run when this thread enters the kernel for events, not by interrupting it;
//! every submit carries IORING_ENTER_GETEVENTS, so it also runs the completion work pending since
//! the last one and the completion queue can then be read without a system call (`peek`). A
//! wait for completions happens only when nothing is visible. No SQPOLL, registered files or
//! fixed buffers: fio's io_uring engine does not use them by default either, so comparisons are
//! like for like.

use std::time::Duration;

use io_uring::{IoUring, opcode, types};

use super::{Capabilities, Completion, Engine, EngineError, IoOp};
use crate::job::Direction;

/// `IORING_ENTER_GETEVENTS` from linux/io_uring.h (not exported by the libc crate).
const IORING_ENTER_GETEVENTS: u32 = 1;

pub struct UringEngine {
    ring: IoUring,
    /// Entries pushed to the submission queue but not yet handed to the kernel.
    pending: usize,
}

impl UringEngine {
    pub fn new(depth: u32) -> Result<Self, EngineError> {
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
        Ok(UringEngine { ring, pending: 0 })
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
        let fd = types::Fd(op.fd);
        let entry = match op.dir {
            Direction::Read => opcode::Read::new(fd, op.buf, op.len)
                .offset(op.offset)
                .build(),
            Direction::Write => opcode::Write::new(fd, op.buf, op.len)
                .offset(op.offset)
                .build(),
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
