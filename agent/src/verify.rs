//! Exact data verification: self-describing blocks, the generation of every acknowledged
//! write, a saved state, and the re-read that finds lost, stale and corrupted blocks by offset.
//!
//! Every block a verifying job writes carries a header (magic, offset, length, write
//! generation, file index, run seed) and a crc32c of header and data. The runner keeps, per
//! block, the generation of its last *acknowledged* write: a write acknowledged but never
//! persisted (a `drop_writes` fault, a lying cache) leaves an older generation (stale) or the
//! layout's fill (lost) on disk, and the re-read finds it. Exactness rules:
//!
//! - one write per block in flight at a time (the runner holds a second write to a block until
//!   the first completes, like fio's `serialize_overlap`), so the device's ordering of two
//!   overlapping writes never makes the expected content ambiguous;
//! - a write that failed (EIO) may or may not have reached the medium: either the previous
//!   acknowledged generation or the failed one is accepted (`lo..=expect`);
//! - blocks never acknowledged (`expect == 0`) may hold anything that is not a corrupted block
//!   of ours;
//! - one write block size per job, aligned to itself, so blocks never overlap (checked before
//!   the run: `check_job`).
//!
//! The state (generation per block) is saved next to the data files when the job ends, so
//! `lockstep-agent verify` can check the same files later (after a restart), with the same
//! rules. Findings are listed by file and offset (at most `FINDINGS_LIMIT` per report; the
//! counts are always exact).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::confine::{self, Scope};
use crate::engine::{self, IoOp};
use crate::job::{Direction, JobSpec};
pub use lockstep_core::verify::{
    BlockRef, FINDINGS_LIMIT, Finding, FindingKind, VerifyReport, render_text,
};

const MAGIC: u64 = 0x3130_5650_5453_4b4c; // "LKSTPV01"
/// Bytes of header at the start of every verified block.
pub const HEADER: usize = 40;
/// First line of a state file.
const STATE_VERSION: &str = "lockstep-verify-state 1";

/// Fills a write buffer with a self-describing block: header (magic, offset, len, generation,
/// file, seed) then deterministic data, then the crc32c of everything but the crc field.
pub fn fill_block(buf: &mut [u8], file: u32, offset: u64, generation: u32, seed: u64) {
    let len = buf.len();
    crate::layout::fill_pseudo_random(&mut buf[HEADER..], mix(seed, offset, generation as u64));
    buf[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    buf[8..16].copy_from_slice(&offset.to_le_bytes());
    buf[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    buf[20..24].copy_from_slice(&generation.to_le_bytes());
    buf[24..28].copy_from_slice(&file.to_le_bytes());
    buf[28..36].copy_from_slice(&seed.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[..36]), &buf[HEADER..]);
    buf[36..40].copy_from_slice(&crc.to_le_bytes());
}

fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a block read back holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// A block of this run (this seed) with a valid checksum, at this generation.
    Ours { generation: u32 },
    /// Not one of this run's blocks (the layout's fill, zeros, another run's block).
    Foreign,
    /// Our magic, but header or checksum do not match: torn, misdirected or bit-rotted.
    Corrupt,
}

pub fn read_content(buf: &[u8], file: u32, offset: u64, seed: u64) -> Content {
    if buf.len() < HEADER || buf[0..8] != MAGIC.to_le_bytes() {
        return Content::Foreign;
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[..36]), &buf[HEADER..]);
    if buf[36..40] != crc.to_le_bytes() {
        return Content::Corrupt;
    }
    if buf[28..36] != seed.to_le_bytes() {
        // A valid block of another run: for this run, the write never happened.
        return Content::Foreign;
    }
    if buf[8..16] != offset.to_le_bytes()
        || buf[16..20] != (buf.len() as u32).to_le_bytes()
        || buf[24..28] != file.to_le_bytes()
    {
        // Ours, intact, but at the wrong place: a misdirected write.
        return Content::Corrupt;
    }
    Content::Ours {
        generation: u32::from_le_bytes(buf[20..24].try_into().unwrap()),
    }
}

/// The expectation for one block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Block {
    pub len: u32,
    /// Writes issued to this block so far (the next write is generation `issued + 1`).
    pub issued: u32,
    /// Generation of the last acknowledged write (0: none); the block must hold a generation
    /// in `lo..=expect`.
    pub expect: u32,
    pub lo: u32,
    /// A write to this block is in flight.
    pub inflight: bool,
    /// The last acknowledged write was dropped by a `drop_writes` fault (ground truth for
    /// tests and drills: the verifier must find exactly these).
    pub dropped: bool,
}

/// Per job clone: the expectation of every block it wrote.
#[derive(Debug, Clone, Default)]
pub struct VerifyState {
    pub seed: u64,
    pub blocks: HashMap<(u32, u64), Block>,
    /// Writes the `drop_writes` fault dropped (each one acknowledged).
    pub dropped_writes: u64,
}

impl VerifyState {
    pub fn new(seed: u64) -> Self {
        VerifyState {
            seed,
            ..Default::default()
        }
    }

    /// Whether a write to this block must wait (another write to it is in flight).
    pub fn busy(&self, file: u32, offset: u64) -> bool {
        self.blocks.get(&(file, offset)).is_some_and(|b| b.inflight)
    }

    /// A write is issued: returns its generation.
    pub fn issue(&mut self, file: u32, offset: u64, len: u32) -> u32 {
        let b = self.blocks.entry((file, offset)).or_default();
        b.len = len;
        b.issued += 1;
        b.inflight = true;
        b.issued
    }

    /// A write completed: acknowledged (`ok`, `dropped` when the fault swallowed it) or failed.
    pub fn complete(&mut self, file: u32, offset: u64, generation: u32, ok: bool, dropped: bool) {
        let Some(b) = self.blocks.get_mut(&(file, offset)) else {
            return;
        };
        b.inflight = false;
        if ok {
            b.expect = generation;
            b.lo = generation;
            b.dropped = dropped;
            if dropped {
                self.dropped_writes += 1;
            }
        } else {
            // Maybe written, maybe not: the old generation or this one.
            b.lo = b.lo.min(b.expect);
            b.expect = generation;
            b.dropped = false;
        }
    }
}

/// Refuses jobs that cannot be verified block by block (before any IO).
pub fn check_job(job: &JobSpec) -> Result<(), String> {
    let w = &job.bs[Direction::Write as usize];
    if w.len() != 1 {
        return Err(
            "verify=crc32c needs one write block size (bssplit= mixes sizes whose blocks overlap)"
                .into(),
        );
    }
    if w[0].0 != job.min_bs() {
        return Err(format!(
            "verify=crc32c needs the write block size ({}) to be the smallest block size ({}): offsets are aligned to the smallest, so larger writes would overlap",
            w[0].0,
            job.min_bs()
        ));
    }
    if (w[0].0 as usize) < HEADER + 8 {
        return Err(format!(
            "verify=crc32c needs blocks of at least {} bytes",
            HEADER + 8
        ));
    }
    Ok(())
}

/// Checks one block against its expectation; `None` when it is as expected.
fn judge(content: Content, b: &Block) -> Option<(FindingKind, Option<u32>, &'static str)> {
    match content {
        Content::Ours { generation } if (b.lo..=b.expect).contains(&generation) => None,
        Content::Ours { generation } if generation < b.lo => {
            Some((FindingKind::Stale, Some(generation), ""))
        }
        Content::Ours { generation } => Some((
            FindingKind::Corrupt,
            Some(generation),
            "a generation that was never acknowledged",
        )),
        Content::Foreign if b.lo == 0 => None,
        Content::Foreign => Some((FindingKind::Lost, None, "")),
        Content::Corrupt => Some((FindingKind::Corrupt, None, "header or crc32c mismatch")),
    }
}

/// A 4 KiB-aligned buffer (O_DIRECT reads need one).
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout =
            std::alloc::Layout::from_size_align(len.max(4096).next_multiple_of(4096), 4096)
                .expect("layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, layout }
    }
    fn slice(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: len <= layout.size() (callers ask for at most the size they made it with).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len.min(self.layout.size())) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Re-reads every block of `state` from `files` (open, in the order of the state's file
/// indexes; `names` for the report) and reports what it found, sorted by file and offset.
pub fn check(state: &VerifyState, files: &[File], names: &[String]) -> VerifyReport {
    let mut r = VerifyReport {
        dropped_writes: state.dropped_writes,
        ..Default::default()
    };
    let mut keys: Vec<(&(u32, u64), &Block)> = state.blocks.iter().collect();
    keys.sort_by_key(|(k, _)| **k);
    let max_len = keys
        .iter()
        .map(|(_, b)| b.len as usize)
        .max()
        .unwrap_or(4096);
    let mut buf = Aligned::new(max_len);
    for (&(file, offset), b) in keys {
        let name = names
            .get(file as usize)
            .cloned()
            .unwrap_or_else(|| format!("file #{file}"));
        if b.dropped && b.lo == b.expect && r.dropped_blocks.len() < FINDINGS_LIMIT {
            r.dropped_blocks.push(BlockRef {
                file: name.clone(),
                offset,
            });
        }
        r.blocks += 1;
        let Some(f) = files.get(file as usize) else {
            r.errors.push(format!("{name}: not open"));
            continue;
        };
        let data = buf.slice(b.len as usize);
        let op = IoOp {
            dir: Direction::Read,
            fd: f.as_raw_fd(),
            file,
            offset,
            len: b.len,
            buf: data.as_mut_ptr(),
            tag: 0,
        };
        let n = engine::sync_rw(&op);
        let verdict = if n != b.len as i64 {
            Some((
                FindingKind::Corrupt,
                None,
                if n < 0 {
                    "read error"
                } else {
                    "short read (file truncated?)"
                },
            ))
        } else {
            judge(read_content(data, file, offset, state.seed), b)
        };
        match verdict {
            None => r.good += 1,
            Some((kind, found, detail)) => {
                match kind {
                    FindingKind::Lost => r.lost += 1,
                    FindingKind::Stale => r.stale += 1,
                    FindingKind::Corrupt => r.corrupt += 1,
                }
                if r.findings.len() < FINDINGS_LIMIT {
                    let (expected, detail) = if b.expect == ANY_LATER {
                        (b.lo, "from a checkpoint: this generation or a later one")
                    } else {
                        (b.expect, detail)
                    };
                    r.findings.push(Finding {
                        kind,
                        file: name,
                        offset,
                        len: b.len,
                        expected,
                        found,
                        detail: detail.into(),
                    });
                }
            }
        }
    }
    r
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a lockstep verify state ({problem})")]
    Format { path: String, problem: String },
}

#[derive(Debug, Serialize, Deserialize)]
struct StateHeader {
    job: String,
    clone: u32,
    seed: u64,
    files: Vec<String>,
    blocks: u64,
    dropped_writes: u64,
    /// Saved while the job was still writing: every block must hold at least the generation
    /// acknowledged by then, and any later one is fine (writes went on after the checkpoint).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    checkpoint: bool,
}

/// A checkpoint record's upper bound: any generation written after the checkpoint.
const ANY_LATER: u32 = u32::MAX;

/// Where a clone's state goes: beside its first file, `<job>.<clone>.verify-state`.
pub fn state_path(first_file: &Path, job: &str, clone: u32) -> PathBuf {
    first_file.with_file_name(format!("{job}.{clone}.verify-state"))
}

/// Saves a clone's state atomically (temporary file, fsync, rename): a JSON header line, then
/// one 25-byte record per block (file u32, offset u64, len u32, lo u32, expect u32, dropped u8,
/// little-endian).
pub fn save(
    scope: &Scope,
    path: &Path,
    job: &str,
    clone: u32,
    files: &[String],
    state: &VerifyState,
) -> Result<(), StateError> {
    write_state(scope, path, job, clone, files, state, false)
}

/// Saves a checkpoint of a clone's state while it is still writing, so an agent that dies
/// mid-run (a `kill` fault, a crashed host) leaves something to verify after a restart: every
/// write acknowledged before the checkpoint must still be there (or a later generation of its
/// block). The job's final save replaces it.
pub fn save_checkpoint(
    scope: &Scope,
    path: &Path,
    job: &str,
    clone: u32,
    files: &[String],
    state: &VerifyState,
) -> Result<(), StateError> {
    write_state(scope, path, job, clone, files, state, true)
}

fn write_state(
    scope: &Scope,
    path: &Path,
    job: &str,
    clone: u32,
    files: &[String],
    state: &VerifyState,
    checkpoint: bool,
) -> Result<(), StateError> {
    let p = path.display().to_string();
    let io = |source| StateError::Io {
        path: p.clone(),
        source,
    };
    let tmp = path.with_extension("verify-state.tmp");
    // The state file's name is lockstep's own, so a link or a hard link in its place (from
    // whoever can write the directory) is never followed or truncated.
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW;
    let f = scope.open(&tmp, flags, 0o644).map_err(io)?;
    confine::check_private(&tmp, &f).map_err(io)?;
    f.set_len(0).map_err(io)?;
    let mut w = BufWriter::new(f);
    let header = StateHeader {
        job: job.into(),
        clone,
        seed: state.seed,
        files: files.to_vec(),
        blocks: state.blocks.len() as u64,
        dropped_writes: state.dropped_writes,
        checkpoint,
    };
    writeln!(w, "{STATE_VERSION}").map_err(io)?;
    serde_json::to_writer(&mut w, &header).map_err(|e| io(e.into()))?;
    w.write_all(b"\n").map_err(io)?;
    let mut keys: Vec<_> = state.blocks.iter().collect();
    keys.sort_by_key(|(k, _)| **k);
    for (&(file, offset), b) in keys {
        // A write still in flight cannot be at the end of a job; if one were, its block is
        // saved as "the previous generation or this one".
        let lo = if b.inflight { b.lo.min(b.expect) } else { b.lo };
        let expect = if checkpoint {
            ANY_LATER
        } else if b.inflight {
            b.issued
        } else {
            b.expect
        };
        let mut rec = [0u8; 25];
        rec[0..4].copy_from_slice(&file.to_le_bytes());
        rec[4..12].copy_from_slice(&offset.to_le_bytes());
        rec[12..16].copy_from_slice(&b.len.to_le_bytes());
        rec[16..20].copy_from_slice(&lo.to_le_bytes());
        rec[20..24].copy_from_slice(&expect.to_le_bytes());
        rec[24] = u8::from(b.dropped);
        w.write_all(&rec).map_err(io)?;
    }
    let f = w.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    scope.rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// A saved state: which files, and the expectation per block.
pub struct Saved {
    pub job: String,
    pub clone: u32,
    pub files: Vec<String>,
    pub state: VerifyState,
    /// Saved while the job was still writing (its agent died before the job's end).
    pub checkpoint: bool,
}

pub fn load(path: &Path) -> Result<Saved, StateError> {
    let p = path.display().to_string();
    let fmt = |problem: String| StateError::Format {
        path: p.clone(),
        problem,
    };
    let f = File::open(path).map_err(|source| StateError::Io {
        path: p.clone(),
        source,
    })?;
    let meta = f.metadata().map_err(|source| StateError::Io {
        path: p.clone(),
        source,
    })?;
    if !meta.is_file() {
        return Err(fmt("not a regular file".into()));
    }
    let mut r = BufReader::new(f);
    let mut line = String::new();
    // The two header lines are short; a file that is not a state file (or `/dev/zero` behind a
    // link) must not be read whole looking for a newline.
    const HEADER_LIMIT: u64 = 1 << 20;
    (&mut r)
        .take(HEADER_LIMIT)
        .read_line(&mut line)
        .map_err(|source| StateError::Io {
            path: p.clone(),
            source,
        })?;
    if line.trim_end() != STATE_VERSION {
        return Err(fmt(format!("first line is not '{STATE_VERSION}'")));
    }
    line.clear();
    (&mut r)
        .take(HEADER_LIMIT)
        .read_line(&mut line)
        .map_err(|source| StateError::Io {
            path: p.clone(),
            source,
        })?;
    let records = meta
        .len()
        .saturating_sub(r.stream_position().unwrap_or(0) as u64)
        / 25;
    let h: StateHeader = serde_json::from_str(&line).map_err(|e| fmt(format!("header: {e}")))?;
    let mut state = VerifyState {
        seed: h.seed,
        dropped_writes: h.dropped_writes,
        ..Default::default()
    };
    if h.blocks > records {
        return Err(fmt(format!(
            "the header promises {} records and the file holds {records}",
            h.blocks
        )));
    }
    let mut rec = [0u8; 25];
    for i in 0..h.blocks {
        r.read_exact(&mut rec)
            .map_err(|e| fmt(format!("record {i} of {}: {e}", h.blocks)))?;
        let le32 = |a: usize| u32::from_le_bytes(rec[a..a + 4].try_into().unwrap());
        let file = le32(0);
        if file as usize >= h.files.len() {
            return Err(fmt(format!("record {i}: file index {file} out of range")));
        }
        let offset = u64::from_le_bytes(rec[4..12].try_into().unwrap());
        let (len, lo, expect) = (le32(12), le32(16), le32(20));
        state.blocks.insert(
            (file, offset),
            Block {
                len,
                issued: expect,
                expect,
                lo,
                inflight: false,
                dropped: rec[24] != 0,
            },
        );
    }
    Ok(Saved {
        job: h.job,
        clone: h.clone,
        files: h.files,
        state,
        checkpoint: h.checkpoint,
    })
}

/// Verifies from a saved state: opens the files it names (O_DIRECT when possible, so the read
/// comes from the device rather than the page cache) and checks every block.
pub fn verify_saved(path: &Path) -> Result<VerifyReport, StateError> {
    let saved = load(path)?;
    let mut files = Vec::new();
    let mut report = VerifyReport::default();
    for name in &saved.files {
        let opened = crate::layout::open_target(&Scope::Named, Path::new(name), true, false)
            .or_else(|_| crate::layout::open_target(&Scope::Named, Path::new(name), false, false));
        match opened {
            Ok(f) => files.push(f),
            Err(e) => {
                report.errors.push(format!("{name}: {e}"));
                // Keep indexes aligned: every block of this file will be reported unreadable.
                files.push(File::open("/dev/null").map_err(|source| StateError::Io {
                    path: name.clone(),
                    source,
                })?);
            }
        }
    }
    let mut r = check(&saved.state, &files, &saved.files);
    r.state_files.push(if saved.checkpoint {
        format!(
            "{} (a checkpoint taken while the job was writing: every write acknowledged before it was checked, later ones are accepted)",
            path.display()
        )
    } else {
        path.display().to_string()
    });
    report.merge(&r);
    Ok(report)
}

/// Whether every data file a state names still exists (reads only the header).
pub fn data_files_exist(state: &Path) -> bool {
    let Ok(f) = File::open(state) else {
        return false;
    };
    let mut r = BufReader::new(f);
    let mut line = String::new();
    if r.read_line(&mut line).is_err() || line.trim_end() != STATE_VERSION {
        return false;
    }
    line.clear();
    if r.read_line(&mut line).is_err() {
        return false;
    }
    serde_json::from_str::<StateHeader>(&line)
        .is_ok_and(|h| h.files.iter().all(|f| Path::new(f).exists()))
}

/// State files in a directory (`*.verify-state`), sorted; a file path is returned as is.
pub fn find_states(path: &Path) -> Result<Vec<PathBuf>, StateError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let rd = std::fs::read_dir(path).map_err(|source| StateError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".verify-state"))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Verifies every state file found under `paths` (files, or directories holding them).
pub fn verify_paths(paths: &[PathBuf]) -> Result<VerifyReport, StateError> {
    let mut report = VerifyReport::default();
    let mut found = 0;
    for p in paths {
        for sp in find_states(p)? {
            found += 1;
            report.merge(&verify_saved(&sp)?);
        }
    }
    if found == 0 {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(StateError::Format {
            path: shown.join(", "),
            problem: "no *.verify-state file there (a verifying job saves one beside its \
                      files; keep them with --keep-files)"
                .into(),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: u64 = 42;

    fn block(file: u32, offset: u64, generation: u32, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        fill_block(&mut b, file, offset, generation, SEED);
        b
    }

    #[test]
    fn blocks_describe_themselves() {
        let b = block(1, 8192, 3, 4096);
        assert_eq!(
            read_content(&b, 1, 8192, SEED),
            Content::Ours { generation: 3 }
        );
        // Another place, another file, another run.
        assert_eq!(read_content(&b, 1, 4096, SEED), Content::Corrupt);
        assert_eq!(read_content(&b, 2, 8192, SEED), Content::Corrupt);
        assert_eq!(read_content(&b, 1, 8192, SEED + 1), Content::Foreign);
        let mut flipped = b.clone();
        flipped[3000] ^= 1;
        assert_eq!(read_content(&flipped, 1, 8192, SEED), Content::Corrupt);
        assert_eq!(read_content(&[7u8; 4096], 1, 8192, SEED), Content::Foreign);
    }

    #[test]
    fn expectations_follow_acknowledgements() {
        let mut s = VerifyState::new(SEED);
        let g1 = s.issue(0, 0, 4096);
        assert!(s.busy(0, 0));
        s.complete(0, 0, g1, true, false);
        let g2 = s.issue(0, 0, 4096);
        s.complete(0, 0, g2, true, true); // dropped: acknowledged, not written
        let b = s.blocks[&(0, 0)];
        assert_eq!((b.expect, b.lo, b.dropped), (2, 2, true));
        assert_eq!(s.dropped_writes, 1);
        // On disk: generation 1 -> stale; nothing of ours -> lost.
        assert_eq!(
            judge(Content::Ours { generation: 1 }, &b).unwrap().0,
            FindingKind::Stale
        );
        assert_eq!(judge(Content::Foreign, &b).unwrap().0, FindingKind::Lost);
        assert!(judge(Content::Ours { generation: 2 }, &b).is_none());
        // A failed write: the old or the new generation.
        let g3 = s.issue(0, 0, 4096);
        s.complete(0, 0, g3, false, false);
        let b = s.blocks[&(0, 0)];
        assert_eq!((b.lo, b.expect), (2, 3));
        assert!(judge(Content::Ours { generation: 2 }, &b).is_none());
        assert!(judge(Content::Ours { generation: 3 }, &b).is_none());
        assert_eq!(
            judge(Content::Ours { generation: 4 }, &b).unwrap().0,
            FindingKind::Corrupt
        );
        // Never acknowledged: anything but our corruption.
        let g = s.issue(0, 4096, 4096);
        s.complete(0, 4096, g, false, false);
        let b = s.blocks[&(0, 4096)];
        assert!(judge(Content::Foreign, &b).is_none());
        assert_eq!(judge(Content::Corrupt, &b).unwrap().0, FindingKind::Corrupt);
    }

    #[test]
    fn checks_real_files_and_a_saved_state_finds_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut data = vec![0u8; 16 * 4096];
        crate::layout::fill_pseudo_random(&mut data, 9);
        let mut s = VerifyState::new(SEED);
        // Blocks 0..16: written once; block 3 then dropped (stale), block 5's only write
        // dropped (lost), block 7 corrupted afterwards, block 15 never written.
        for i in 0..15u64 {
            let g = s.issue(0, i * 4096, 4096);
            let dropped = i == 5;
            s.complete(0, i * 4096, g, true, dropped);
            if !dropped {
                data[(i * 4096) as usize..((i + 1) * 4096) as usize].copy_from_slice(&block(
                    0,
                    i * 4096,
                    g,
                    4096,
                ));
            }
        }
        let g = s.issue(0, 3 * 4096, 4096);
        s.complete(0, 3 * 4096, g, true, true);
        data[7 * 4096 + 100] ^= 0xff;
        std::fs::write(&path, &data).unwrap();
        let names = vec![path.display().to_string()];
        let r = check(&s, &[File::open(&path).unwrap()], &names);
        assert_eq!(
            (r.blocks, r.good, r.lost, r.stale, r.corrupt),
            (15, 12, 1, 1, 1)
        );
        let at: Vec<(FindingKind, u64)> = r.findings.iter().map(|f| (f.kind, f.offset)).collect();
        assert_eq!(
            at,
            [
                (FindingKind::Stale, 3 * 4096),
                (FindingKind::Lost, 5 * 4096),
                (FindingKind::Corrupt, 7 * 4096)
            ]
        );
        assert_eq!(r.findings[0].found, Some(1));
        assert_eq!(r.findings[0].expected, 2);
        let dropped: Vec<u64> = r.dropped_blocks.iter().map(|b| b.offset).collect();
        assert_eq!(dropped, [3 * 4096, 5 * 4096]);
        assert_eq!(r.dropped_writes, 2);
        // The same from the saved state, by a later process.
        let sp = state_path(&path, "j", 0);
        save(&Scope::Named, &sp, "j", 0, &names, &s).unwrap();
        assert_eq!(find_states(dir.path()).unwrap(), vec![sp.clone()]);
        let later = verify_saved(&sp).unwrap();
        assert_eq!(
            (later.good, later.lost, later.stale, later.corrupt),
            (12, 1, 1, 1)
        );
        assert_eq!(later.findings, r.findings);
        assert_eq!(later.dropped_blocks, r.dropped_blocks);
        std::fs::write(&sp, "garbage\n").unwrap();
        assert!(
            verify_saved(&sp)
                .err()
                .unwrap()
                .to_string()
                .contains("not a lockstep verify state")
        );
    }

    /// A checkpoint taken mid-run, then more writes, then the process dies: what was
    /// acknowledged before the checkpoint must be there or newer; a block rolled back to an
    /// older generation is stale and one never persisted is lost.
    #[test]
    fn a_checkpoint_accepts_later_writes_and_catches_older_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut data = vec![0u8; 8 * 4096];
        let mut s = VerifyState::new(SEED);
        let write = |s: &mut VerifyState, data: &mut Vec<u8>, i: u64, persist: bool| {
            let g = s.issue(0, i * 4096, 4096);
            s.complete(0, i * 4096, g, true, false);
            if persist {
                data[(i * 4096) as usize..((i + 1) * 4096) as usize].copy_from_slice(&block(
                    0,
                    i * 4096,
                    g,
                    4096,
                ));
            }
            g
        };
        for i in 0..6u64 {
            write(&mut s, &mut data, i, true);
        }
        // Block 1 rewritten (generation 2) before the checkpoint; the device keeps generation 1.
        let old = data[4096..8192].to_vec();
        write(&mut s, &mut data, 1, true);
        data[4096..8192].copy_from_slice(&old);
        // Block 4's only write is lost by the device.
        data[4 * 4096..5 * 4096].fill(0);
        // A write in flight at the checkpoint: either generation will do.
        let g3 = s.issue(0, 3 * 4096, 4096);
        let sp = state_path(&path, "j", 0);
        let names = vec![path.display().to_string()];
        save_checkpoint(&Scope::Named, &sp, "j", 0, &names, &s).unwrap();
        // After the checkpoint: block 3's write lands, block 0 is rewritten twice.
        s.complete(0, 3 * 4096, g3, true, false);
        data[3 * 4096..4 * 4096].copy_from_slice(&block(0, 3 * 4096, g3, 4096));
        write(&mut s, &mut data, 0, true);
        write(&mut s, &mut data, 0, true);
        std::fs::write(&path, &data).unwrap();
        let r = verify_saved(&sp).unwrap();
        assert_eq!(
            (r.blocks, r.good, r.lost, r.stale, r.corrupt),
            (6, 4, 1, 1, 0),
            "{r:?}"
        );
        let at: Vec<(FindingKind, u64, u32)> = r
            .findings
            .iter()
            .map(|f| (f.kind, f.offset, f.expected))
            .collect();
        assert_eq!(
            at,
            [
                (FindingKind::Stale, 4096, 2),
                (FindingKind::Lost, 4 * 4096, 1)
            ]
        );
        assert!(r.findings[0].detail.contains("checkpoint"));
        // The same blocks judged by the final state: block 0 must now be exactly generation 3.
        save(&Scope::Named, &sp, "j", 0, &names, &s).unwrap();
        let r = verify_saved(&sp).unwrap();
        assert_eq!((r.good, r.lost, r.stale), (4, 1, 1), "{r:?}");
    }

    #[test]
    fn hostile_state_files_are_refused_without_reading_them_whole() {
        let dir = tempfile::tempdir().unwrap();
        let sp = dir.path().join("j.0.verify-state");
        let header = r#"{"job":"j","clone":0,"seed":1,"files":["x"],"blocks":1000000000000,"dropped_writes":0,"checkpoint":false}"#;
        std::fs::write(&sp, format!("{STATE_VERSION}\n{header}\n")).unwrap();
        let e = load(&sp).err().unwrap().to_string();
        assert!(e.contains("promises 1000000000000 records"), "{e}");
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("z")).unwrap();
        let e = load(&dir.path().join("z")).err().unwrap().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn jobs_that_cannot_be_verified_block_by_block_are_refused() {
        let mut j = JobSpec::with_defaults("v", Default::default());
        assert!(check_job(&j).is_ok());
        j.bs[1] = vec![(4096, 50), (8192, 50)];
        assert!(check_job(&j).unwrap_err().contains("one write block size"));
        j.bs[1] = vec![(8192, 100)];
        assert!(check_job(&j).unwrap_err().contains("smallest block size"));
    }
}
