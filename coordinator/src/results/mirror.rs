//! What the primaries of mirrored pairs saw: each mirrored write's latency broken into the local
//! write, the network (round trip minus the backup's write) and the backup's write, merged over
//! a role's volumes like every other histogram; the writes that completed without the backup;
//! and, per pair, the longest stall, fail-overs, the backup's return, what it missed and how it
//! was caught up. Produced by
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
    /// Writes the backup did not acknowledge (during a fail-over, with the link down, dropped
    /// from a full stream queue, on a stream that broke), and their bytes.
    #[serde(default)]
    pub missed_writes: u64,
    #[serde(default)]
    pub missed_bytes: u64,
    /// Each catch-up of the backup (the missed ranges resent from the primary's file).
    #[serde(default)]
    pub catchups: Vec<MirrorCatchUp>,
    /// When the backup had every byte again after its last catch-up, and no fail-over was in
    /// force: a valid fail-over target again (ms from the start).
    #[serde(default)]
    pub valid_again_at_ms: Option<u64>,
    /// Bytes the backup was still owed when the run ended (0: caught up).
    #[serde(default)]
    pub behind_bytes: u64,
}

/// One catch-up: from the first chunk resent to the last byte owed acknowledged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MirrorCatchUp {
    pub start_ms: u64,
    /// `None`: still behind when the run ended.
    pub duration_ms: Option<u64>,
    pub bytes: u64,
}
