//! The null engine: every IO completes at once, nothing is read or written. It measures the cost
//! of lockstep itself (generator, timestamps, histograms), like fio's `ioengine=null`.

use std::time::Duration;

use super::{Capabilities, Completion, Engine, EngineError, IoOp};

pub struct NullEngine {
    queued: Vec<Completion>,
}

impl NullEngine {
    pub fn new(depth: u32) -> Self {
        NullEngine {
            queued: Vec::with_capacity(depth as usize),
        }
    }
}

impl Engine for NullEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "null",
            concurrent: true,
            touches_files: false,
            interleave: false,
        }
    }

    fn queue(&mut self, op: IoOp) -> Result<(), EngineError> {
        self.queued.push(Completion {
            tag: op.tag,
            result: op.len as i64,
        });
        Ok(())
    }

    fn commit(&mut self) -> Result<(), EngineError> {
        Ok(())
    }

    fn reap(
        &mut self,
        _min: usize,
        _timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> Result<(), EngineError> {
        out.append(&mut self.queued);
        Ok(())
    }
}
