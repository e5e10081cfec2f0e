//! Pure analysis of a run's results: plain functions and types, no I/O. Imports `results` and
//! `plan`, nothing above them.
pub mod chokepoint;
pub mod compare;
pub mod curve;
pub mod drill;
pub mod mirror;
pub mod objectives;
pub mod sweep;
