//! lockstep: the coordinator and CLI.
//!
//! Map of the crate:
//! - `timeline`: per-volume, per-interval figures of a run (the report's time series and the
//!   chokepoint finder's input);
//! - `chokepoint`: pure analysis of a run's per-volume timeline that names the volume (or node)
//!   holding the cluster back, with evidence.
pub mod chokepoint;
pub mod timeline;
