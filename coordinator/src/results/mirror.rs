//! What the primaries of mirrored pairs saw: each mirrored write's latency broken into the local
//! write, the network (round trip minus the backup's write) and the backup's write, merged over
//! a role's volumes like every other histogram; the writes that completed without the backup;
//! and, per pair, the longest stall, fail-overs and the backup's return. Produced by
//! `analysis::mirror`, rendered by the exporters; part of the results model, imports no
//! analysis.

use serde::{Deserialize, Serialize};

use super::LatSummary;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MirrorReport {
    pub roles: Vec<MirrorRole>,
}

/// One mirroring role, its volumes merged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MirrorRole {
    pub role: String,
    pub sync: bool,
    pub delay_us: u64,
    /// Writes the backup acknowledged.
    pub mirrored: u64,
    /// Writes completed without the backup's ack (after a fail-over, with the link down, or a
    /// failed write on the backup).
    pub unmirrored: u64,
    /// Per acknowledged write: ready to local completion (fio's lat of the local write).
    pub local: LatSummary,
    /// Per acknowledged write: local completion to the ack, minus the backup's write (the
    /// injected delay included).
    pub network: LatSummary,
    /// Per acknowledged write: the backup's own write.
    pub remote: LatSummary,
    /// Sync: the mirrored writes' latency as the job measured it (ready to completion).
    pub total: LatSummary,
    /// Async: local completion to the backup's ack.
    pub lag: LatSummary,
    /// The role's write latency over the measured phases (every write, from the results'
    /// summaries), what the breakdown is checked against.
    pub measured_write: LatSummary,
    /// (local + network + remote means) / measured write mean − 1, in percent (sync mode).
    pub breakdown_gap_pct: Option<f64>,
    pub pairs: Vec<MirrorPair>,
}

/// One primary volume and its backup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MirrorPair {
    /// `node/volume` of the primary.
    pub primary: String,
    pub backup: String,
    pub mirrored: u64,
    pub unmirrored: u64,
    /// Longest time without a completed mirrored write, and when it began (ms from the start).
    pub longest_stall_ms: u64,
    pub longest_stall_at_ms: u64,
    pub failover_at_ms: Vec<u64>,
    pub recovered_at_ms: Vec<u64>,
    /// Failed over and never answered again before the run ended.
    pub did_not_return: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub link_error: String,
}
