//! Faults in the agent's own IO path. The spec, the gate contract, token buckets and the EBS
//! model are shared with the coordinator and live in `lockstep-core` (`core/src/fault/`); they
//! are re-exported here so the agent's paths (`crate::fault::spec::...`) stay as they were.

pub use lockstep_core::fault::*;

/// From a schedule to the runner's two hooks: `build_gate`, `build_fault`, `SharedGate`.
pub mod build;
/// Latency, EIO, stall and drop-writes faults, and `FaultSet` applying them in their windows.
pub mod faults;
/// `kernel_throttle`: the kernel's block throttle through a cgroup (needs root).
pub mod kernel;

pub use build::{
    AgentClock, GateSet, InstanceShare, SharedGate, build_fault, build_gate, build_volume_gate,
    instance_gates,
};
pub use faults::{DropWritesFault, EioFault, FaultSet, LatencyFault, StallFault};
