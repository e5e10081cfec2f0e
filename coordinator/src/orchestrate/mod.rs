//! Running a plan on agents: connecting, measuring clocks, the synchronized start, the interval
//! streams, lost agents and aborts. Imports `plan` and `results`, nothing above them.
pub mod client;
pub mod lag;
pub mod layout;
pub mod local;
pub mod registry;
pub mod run;
pub mod signals;
pub mod streams;
