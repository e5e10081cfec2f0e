//! lockstep: the coordinator and CLI.
//!
//! Map of the crate:
//! - `chokepoint`: pure analysis of a run's per-volume timeline that names the volume (or node)
//!   holding the cluster back, with evidence.
pub mod chokepoint;
