//! Mirrored pairs: a primary's writes, each written again by a paired backup agent over an
//! agent-to-agent gRPC stream (docs/plan.md, "Mirrored pairs").
//!
//! - `link`: the primary's side, one link per job clone, which the IO loop hands each finished
//!   write to (`runner::MirrorHook`); the injected delay, fail-over and probes;
//! - `backup`: the backup's side of the `Mirror` call, writing into a file of its volume;
//! - `missed`: the byte ranges a backup has not acknowledged, which a catch-up resends;
//! - `stats`: what the primary saw (breakdown per write, stalls, fail-overs), pure.

pub mod backup;
pub mod link;
pub mod missed;
pub mod stats;

pub use link::{LinkConfig, MirrorLink};
pub use stats::MirrorStats;
