//! What exact data verification found (`lockstep-agent verify`, the verify pass after a run):
//! the report both the agent writes and the coordinator merges, judges and prints. How blocks
//! are written and checked is the agent's (`agent/src/verify.rs`).

use serde::{Deserialize, Serialize};

/// Findings listed per report (counts stay exact beyond it).
pub const FINDINGS_LIMIT: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// An acknowledged write is not there at all (the block is not one of ours).
    Lost,
    /// An older generation is there: the last acknowledged write(s) did not persist.
    Stale,
    /// Header or checksum wrong, a block of ours at the wrong place, or unreadable.
    Corrupt,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub file: String,
    pub offset: u64,
    pub len: u32,
    /// Generation of the last acknowledged write.
    pub expected: u32,
    /// Generation found, for stale blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A block by file and offset (the ground truth of dropped writes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlockRef {
    pub file: String,
    pub offset: u64,
}

/// What verification found, for one job clone or merged for a volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Blocks with a known expectation that were read back.
    pub blocks: u64,
    pub good: u64,
    pub lost: u64,
    pub stale: u64,
    pub corrupt: u64,
    /// By file and offset (at most `FINDINGS_LIMIT`).
    pub findings: Vec<Finding>,
    /// Writes a `drop_writes` fault dropped, and the blocks whose last acknowledged write was
    /// one of them (what the findings must be, exactly, when nothing else went wrong).
    #[serde(default)]
    pub dropped_writes: u64,
    #[serde(default)]
    pub dropped_blocks: Vec<BlockRef>,
    /// Where the state was saved (for `lockstep-agent verify` later), if it was.
    #[serde(default)]
    pub state_files: Vec<String>,
    /// Problems that prevented part of the verification (state not saved, file unreadable).
    #[serde(default)]
    pub errors: Vec<String>,
}

impl VerifyReport {
    pub fn bad(&self) -> u64 {
        self.lost + self.stale + self.corrupt
    }

    pub fn merge(&mut self, o: &VerifyReport) {
        self.blocks += o.blocks;
        self.good += o.good;
        self.lost += o.lost;
        self.stale += o.stale;
        self.corrupt += o.corrupt;
        let room = FINDINGS_LIMIT.saturating_sub(self.findings.len());
        self.findings.extend(o.findings.iter().take(room).cloned());
        self.dropped_writes += o.dropped_writes;
        let room = FINDINGS_LIMIT.saturating_sub(self.dropped_blocks.len());
        self.dropped_blocks
            .extend(o.dropped_blocks.iter().take(room).cloned());
        self.state_files.extend(o.state_files.iter().cloned());
        self.errors.extend(o.errors.iter().cloned());
    }

    /// One line: "verify: 4096 blocks, 4055 good, 0 lost, 41 stale, 0 corrupt".
    pub fn summary(&self) -> String {
        format!(
            "{} blocks, {} good, {} lost, {} stale, {} corrupt",
            self.blocks, self.good, self.lost, self.stale, self.corrupt
        )
    }
}

/// A readable account of a report: the counts, then every finding by file and offset.
/// One finding as the reports print it: `Lost /v/f@4096 len 4096: expected generation 3`.
impl std::fmt::Display for Finding {
    fn fmt(&self, out: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            out,
            "{:?} {}@{} len {}: expected generation {}",
            self.kind, self.file, self.offset, self.len, self.expected
        )?;
        if let Some(g) = self.found {
            write!(out, ", found generation {g}")?;
        }
        if !self.detail.is_empty() {
            write!(out, " ({})", self.detail)?;
        }
        Ok(())
    }
}

pub fn render_text(r: &VerifyReport) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let verdict = if r.bad() == 0 && r.errors.is_empty() {
        "ok"
    } else {
        "FAILED"
    };
    let _ = writeln!(o, "verify: {verdict}: {}", r.summary());
    for s in &r.state_files {
        let _ = writeln!(o, "  state: {s}");
    }
    for f in &r.findings {
        let _ = writeln!(o, "  {f}");
    }
    if (r.bad() as usize) > r.findings.len() {
        let _ = writeln!(
            o,
            "  ... {} more not listed",
            r.bad() as usize - r.findings.len()
        );
    }
    for e in &r.errors {
        let _ = writeln!(o, "  error: {e}");
    }
    o
}
