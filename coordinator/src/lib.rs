//! lockstep: the coordinator and CLI.
//!
//! Map of the crate:
//! - `timeline`: per-volume, per-interval figures of a run (the report's time series and the
//!   chokepoint finder's input);
//! - `clock`: clock offsets (lowest round trip wins) and the achieved start skew;
//! - `merge`: interval reports into volume, node and cluster results, from merged histograms;
//! - `results`: the one results structure of a run (`results.json`);
//! - `chokepoint`: pure analysis of a run's per-volume timeline that names the volume (or node)
//!   holding the cluster back, with evidence.
pub mod chokepoint;
pub mod clock;
pub mod merge;
pub mod plan;
pub mod profiles;
pub mod results;
pub mod timeline;
