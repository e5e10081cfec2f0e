//! The portable engine: pread/pwrite. With iodepth 1 the IO runs on the job's own thread, which
//! is fio's `psync`; with a deeper queue, `iodepth` worker threads each run one IO at a time, so
//! the device sees the same number of IOs in flight as with io_uring.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Capabilities, Completion, Engine, EngineError, IoOp, sync_rw};

pub struct ThreadEngine {
    mode: Mode,
}

enum Mode {
    /// Ops run in `reap`, on the caller's thread, after `commit` stamped them as submitted, so
    /// the measured completion latency is the syscall's, as in fio's psync.
    Inline { queued: Vec<IoOp> },
    Workers {
        to_workers: Option<Sender<IoOp>>,
        from_workers: Receiver<Completion>,
        workers: Vec<JoinHandle<()>>,
        /// Ops queued but not yet handed to the workers (handed over at commit).
        queued: Vec<IoOp>,
    },
}

impl ThreadEngine {
    /// An engine for `depth` IOs in flight: inline for 1, else `depth` worker threads, at most
    /// `limits::MAX_SYNC_WORKERS`. A thread that cannot be started is an error (the ones
    /// already started are stopped and joined), never a panic.
    pub fn new(depth: u32) -> Result<Self, EngineError> {
        let (max, why) = crate::limits::max_depth(crate::job::EngineKind::Psync);
        if depth > max {
            return Err(EngineError::TooDeep {
                engine: "psync",
                depth,
                max,
                why,
            });
        }
        if depth <= 1 {
            return Ok(ThreadEngine {
                mode: Mode::Inline {
                    queued: Vec::with_capacity(1),
                },
            });
        }
        let (to_workers, ops) = channel::<IoOp>();
        let ops = std::sync::Arc::new(std::sync::Mutex::new(ops));
        let (done, from_workers) = channel::<Completion>();
        let mut workers: Vec<JoinHandle<()>> = Vec::with_capacity(depth as usize);
        for i in 0..depth {
            let ops = ops.clone();
            let done = done.clone();
            let handle = std::thread::Builder::new()
                .name(format!("lockstep-io-{i}"))
                .spawn(move || {
                    loop {
                        let op = match ops.lock() {
                            Ok(rx) => match rx.recv() {
                                Ok(op) => op,
                                Err(_) => return,
                            },
                            Err(_) => return,
                        };
                        let result = sync_rw(&op);
                        if done
                            .send(Completion {
                                tag: op.tag,
                                result,
                            })
                            .is_err()
                        {
                            return;
                        }
                    }
                })
                .map_err(|source| EngineError::Sys {
                    engine: "psync",
                    op: "spawn",
                    source,
                });
            match handle {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    // Closing the channel ends the workers started so far.
                    drop(to_workers);
                    for w in workers {
                        let _ = w.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(ThreadEngine {
            mode: Mode::Workers {
                to_workers: Some(to_workers),
                from_workers,
                workers,
                queued: Vec::with_capacity(depth as usize),
            },
        })
    }
}

impl Engine for ThreadEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "psync",
            concurrent: matches!(self.mode, Mode::Workers { .. }),
            touches_files: true,
            interleave: false,
        }
    }

    fn queue(&mut self, op: IoOp) -> Result<(), EngineError> {
        match &mut self.mode {
            Mode::Inline { queued } | Mode::Workers { queued, .. } => queued.push(op),
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), EngineError> {
        if let Mode::Workers {
            to_workers, queued, ..
        } = &mut self.mode
        {
            let tx = to_workers
                .as_ref()
                .ok_or(EngineError::WorkersGone("psync"))?;
            for op in queued.drain(..) {
                tx.send(op).map_err(|_| EngineError::WorkersGone("psync"))?;
            }
        }
        Ok(())
    }

    fn reap(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<(), EngineError> {
        match &mut self.mode {
            Mode::Inline { queued } => {
                for op in queued.drain(..) {
                    out.push(Completion {
                        tag: op.tag,
                        result: sync_rw(&op),
                    });
                }
                Ok(())
            }
            Mode::Workers { from_workers, .. } => {
                let mut got = 0;
                while let Ok(c) = from_workers.try_recv() {
                    out.push(c);
                    got += 1;
                }
                let deadline = timeout.map(|t| std::time::Instant::now() + t);
                while got < min {
                    let c = match deadline {
                        None => from_workers
                            .recv()
                            .map_err(|_| EngineError::WorkersGone("psync"))?,
                        Some(d) => {
                            let left = d.saturating_duration_since(std::time::Instant::now());
                            match from_workers.recv_timeout(left) {
                                Ok(c) => c,
                                Err(RecvTimeoutError::Timeout) => return Ok(()),
                                Err(RecvTimeoutError::Disconnected) => {
                                    return Err(EngineError::WorkersGone("psync"));
                                }
                            }
                        }
                    };
                    out.push(c);
                    got += 1;
                }
                Ok(())
            }
        }
    }
}

impl Drop for ThreadEngine {
    fn drop(&mut self) {
        if let Mode::Workers {
            to_workers,
            workers,
            ..
        } = &mut self.mode
        {
            // Closing the channel ends every worker after its current IO.
            to_workers.take();
            for w in workers.drain(..) {
                let _ = w.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Direction;
    use crate::limits::MAX_SYNC_WORKERS;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_queue_deeper_than_the_worker_limit_is_an_error_not_threads() {
        let e = ThreadEngine::new(MAX_SYNC_WORKERS + 1)
            .err()
            .expect("a depth over the limit is refused");
        let text = e.to_string();
        assert!(text.contains("at most 256"), "{text}");
        assert!(text.contains("iodepth=257"), "{text}");
    }

    #[test]
    fn workers_run_ios_at_the_largest_allowed_depth() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mut engine = ThreadEngine::new(MAX_SYNC_WORKERS).unwrap();
        let mut buf = vec![0u8; 4096];
        engine
            .queue(IoOp {
                dir: Direction::Read,
                fd: file.as_raw_fd(),
                file: 0,
                offset: 4096,
                len: 4096,
                buf: buf.as_mut_ptr(),
                tag: 3,
            })
            .unwrap();
        engine.commit().unwrap();
        let mut out = Vec::new();
        engine
            .reap(1, Some(Duration::from_secs(10)), &mut out)
            .unwrap();
        assert_eq!(
            out,
            vec![Completion {
                tag: 3,
                result: 4096
            }]
        );
        assert!(buf.iter().all(|&b| b == 7));
    }
}
