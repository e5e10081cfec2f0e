//! Faults in the agent's own IO path: no privilege needed, so they work on any host.
//!
//! This crate holds the parts both sides share: the fault spec and its validation, the gate
//! contract, token buckets and the EBS volume model (the agent throttles with it, the
//! coordinator's chokepoint finder forecasts with it). The agent adds the faults that alter IOs,
//! the gate builder and the kernel throttle (`agent/src/fault/`).
//!
//! The runner consults two small hooks per IO, both pure functions of time and the IO:
//! - an `IoGate` decides *when* an IO may be issued (IOPS/bandwidth caps, EBS volume models with
//!   credit buckets). A gated IO waits before issue, so its latency from the intended issue time
//!   grows the way a throttled cloud volume's does, and the queue backs up (Little's law holds);
//! - an `IoFault` decides *what happens* to an IO (delivered, failed with EIO, delayed, dropped
//!   write) and whether completions are stalled.
//!
//! Times are nanoseconds since the clone's start (the runner's origin), so everything here can be
//! tested without a clock.

use crate::job::Direction;

/// Whether a gate lets an IO through now or at a later instant (ns since origin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Now,
    At(u64),
}

/// Paces IOs: IOPS/bandwidth caps and volume models. `admit` only looks; `charge` takes the
/// IO's cost when it is actually issued (the runner calls it right after the admitted instant).
pub trait IoGate: Send {
    fn admit(&mut self, now_ns: u64, dir: Direction, len: u64) -> Admission;
    fn charge(&mut self, now_ns: u64, dir: Direction, len: u64);
    /// The instant the caller's ns count from, told once before the first `admit`. Gates on
    /// the caller's clock ignore it; a gate shared with loops that began at other instants
    /// (an instance's volumes) needs it to put every loop on one clock: inferring it from the
    /// first `admit` is off by however long the caller's "now" was stale, which on a loaded
    /// host is tens of milliseconds, enough to let one volume run ahead of the shared queue.
    fn origin(&mut self, _t0: std::time::Instant) {}
}

/// What happens to one IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Goes to the device as asked.
    Deliver,
    /// Completes at once with EIO, never reaching the device.
    FailEio,
    /// A write that is acknowledged but never written: the verifier must catch it.
    DropWrite,
    /// Goes to the device; its completion is held back by this many nanoseconds from submission.
    DelayBy(u64),
}

/// Alters IOs: errors, added latency, dropped writes, stalls.
pub trait IoFault: Send {
    fn on_issue(&mut self, now_ns: u64, dir: Direction, len: u64) -> Outcome;
    /// If completions are stalled at `now_ns`, the instant (ns since origin) the stall ends.
    fn stalled_until(&self, now_ns: u64) -> Option<u64>;
}

/// Token buckets and the `iops_cap` / `bw_cap` gates.
pub mod bucket;
/// EBS volume models (gp2, gp3, io1, io2, st1, sc1): gate, ceilings, credit forecast.
pub mod ebs;
/// EC2 instance EBS limits: one gate shared by all of an agent's volumes, and the type table.
pub mod instance;
/// `FaultSpec`, the serialized schedule entry, and its validation.
pub mod spec;
/// `FaultSpec` to and from the protocol's typed `Fault` message, validated on receipt.
pub mod wire;

pub use bucket::{CapGate, CapUnit, TokenBucket};
pub use ebs::{Ceilings, EbsGate, EbsModel, credit_forecast};
pub use instance::{INSTANCE_TYPES, InstanceGate, InstanceModel};
pub use spec::{
    BwCapSpec, CutOffSpec, Directions, DropWritesSpec, EbsSpec, EioSpec, ExecSpec, FaultError,
    FaultKind, FaultSpec, InstanceSpec, IopsCapSpec, KernelThrottleSpec, KillSpec,
    LatencyDistribution, LatencySpec, PauseSpec, SpecError, StallSpec, VolumeType, Window,
    active_faults, validate_all,
};
