//! lockstep-proto: the wire contract between coordinator and agents.
//!
//! - `v1`: the generated gRPC types and service stubs (from `proto/lockstep.proto`);
//! - `histogram`: HdrHistogram V2 encoding (in zlib's stored framing; real deflate is read
//!   too), the only way latencies cross the wire, so the coordinator can merge them exactly
//!   (docs/domain.md#measurement-rules, rule 1);
//! - `PROTOCOL_VERSION`: checked on every call; a mismatch is refused with a clear message.

pub mod histogram;

pub mod v1 {
    tonic::include_proto!("lockstep.v1");
}

/// Bumped on every incompatible change of `lockstep.proto`. 2: faults are typed `Fault`
/// messages (`VolumeWork.faults`); a v1 peer's `faults_json` would be dropped unread.
/// Not bumped when histograms moved from deflate to stored blocks: both framings carry the
/// same cookie and every decoder of v2 (lockstep's, the hdrhistogram crate's) reads both.
/// Not bumped when `LayoutStatus` was added: an older agent answers UNIMPLEMENTED, which the
/// coordinator takes as "no layout progress from this agent", and an older coordinator never
/// asks.
/// Not bumped for the `instance` fault (a new member of `Fault.kind`): an older agent sees no
/// kind it knows and refuses the fault on receipt ("kind is missing"), so it never runs a plan
/// without the limit it asked for.
/// Not bumped for `histogram_digits` (Prepare): an older agent leaves the reply's field 0 and
/// sends 3-digit histograms, which a coordinator asking for 2 refuses by name; an older
/// coordinator never asks, and 0 means 3.
pub const PROTOCOL_VERSION: u32 = 2;

/// The refusal both sides print on version skew.
pub fn version_mismatch(ours: u32, theirs: u32, who: &str) -> String {
    format!(
        "protocol version mismatch: this {who} speaks lockstep protocol v{ours}, the peer speaks v{theirs}; run the same lockstep release on coordinator and agents"
    )
}
