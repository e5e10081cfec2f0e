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
//! While the job runs, the state is a dense table of 8 bytes per block of the clone's layout
//! (`table`): in memory up to `IN_MEMORY_LIMIT`, beyond that in an unlinked file mapped from
//! beside the job's files on the volume. The state (generation per block) is saved next to the
//! data files when the job ends, so `lockstep-agent verify` can check the same files later
//! (after a restart), with the same rules; it streams the saved records, so checking takes no
//! memory per block either. Findings are listed by file and offset (at most `FINDINGS_LIMIT`
//! per report; the counts are always exact).
//!
//! Generations are `u32`, and `u32::MAX` is reserved for checkpoints (`ANY_LATER`). The wrap
//! rule: the write after generation `GEN_MAX` (4.29 billion writes to one block, about 12 hours
//! at 100,000 writes per second to that one block) is generation 1 again, and the block starts
//! over as never acknowledged; from its next acknowledged write on it is checked exactly again.
//! A write lost exactly at the wrap shows as corrupt (a generation never acknowledged) rather
//! than stale.

mod table;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::confine::{self, Scope};
use crate::engine::{self, IoOp};
use crate::job::{Direction, JobSpec};
pub use lockstep_core::verify::{
    BlockRef, FINDINGS_LIMIT, Finding, FindingKind, VerifyReport, render_text,
};
pub use table::{BYTES_PER_BLOCK, IN_MEMORY_LIMIT, Layout, Spill, memory_bytes};

/// The last generation before the wrap (see the module's doc); `u32::MAX` is `ANY_LATER`.
pub const GEN_MAX: u32 = u32::MAX - 1;

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

impl Block {
    /// A write is issued: returns its generation.
    fn issue(&mut self, len: u32) -> u32 {
        if self.issued >= GEN_MAX {
            // The wrap rule (module doc): start over as a block never acknowledged.
            *self = Block::default();
        }
        self.len = len;
        self.issued += 1;
        self.inflight = true;
        self.issued
    }

    /// The write of `generation` completed; true when it counts as a dropped write.
    fn complete(&mut self, generation: u32, ok: bool, dropped: bool) -> bool {
        self.inflight = false;
        if ok {
            self.expect = generation;
            self.lo = generation;
            self.dropped = dropped;
            dropped
        } else {
            // Maybe written, maybe not: the old generation or this one.
            self.lo = self.lo.min(self.expect);
            self.expect = generation;
            self.dropped = false;
            false
        }
    }
}

/// Per job clone: the expectation of every block it wrote.
pub struct VerifyState {
    pub seed: u64,
    /// Writes the `drop_writes` fault dropped (each one acknowledged).
    pub dropped_writes: u64,
    /// Every block of the layout, one word each.
    table: table::Table,
    /// Blocks that have no place in the table: none from the generator (every write is an
    /// aligned whole block of its region), kept so that any offset is still verified exactly;
    /// and every block of a state loaded from a file.
    overflow: BTreeMap<(u32, u64), Block>,
    /// Blocks of the table written at least once.
    written: u64,
}

impl VerifyState {
    /// A state with no layout (every block goes to the overflow map): for tests and loads.
    pub fn new(seed: u64) -> Self {
        Self::for_layout(seed, Layout::default(), None, IN_MEMORY_LIMIT)
            .expect("an empty table needs no file")
    }

    /// A state for a clone's layout: its table in memory up to `memory_limit` bytes, beyond
    /// that in a file at `spill` (none: always in memory).
    pub fn for_layout(
        seed: u64,
        layout: Layout,
        spill: Option<&Spill>,
        memory_limit: u64,
    ) -> std::io::Result<Self> {
        Ok(VerifyState {
            seed,
            dropped_writes: 0,
            table: table::Table::new(layout, spill, memory_limit)?,
            overflow: BTreeMap::new(),
            written: 0,
        })
    }

    /// The same table, read while this state goes on changing (for a checkpoint on another
    /// thread: every block is seen as it was at some instant during the save, which a
    /// checkpoint's "this generation or a later one" allows, since a block's acknowledged
    /// generation only grows).
    pub fn live_view(&self) -> VerifyState {
        VerifyState {
            seed: self.seed,
            dropped_writes: self.dropped_writes,
            table: self.table.clone(),
            overflow: self.overflow.clone(),
            written: self.written,
        }
    }

    /// Where the table's file was made, when the table is on the volume rather than in memory.
    pub fn spilled_to(&self) -> Option<&Path> {
        self.table.spilled_to()
    }

    /// Blocks written at least once.
    pub fn len(&self) -> u64 {
        self.written + self.overflow.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The expectation for one block, if it was written.
    pub fn block(&self, file: u32, offset: u64) -> Option<Block> {
        if let Some(i) = self.table.index_of(file, offset) {
            let w = self.table.load(i);
            if w != 0 {
                return Some(table::decode(w, self.table.layout.bs));
            }
        }
        self.overflow.get(&(file, offset)).copied()
    }

    /// Every block written, in (file, offset) order.
    pub fn blocks(&self) -> impl Iterator<Item = ((u32, u64), Block)> + '_ {
        let mut a = self.table.iter().peekable();
        let mut b = self.overflow.iter().map(|(k, v)| (*k, *v)).peekable();
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if y.0 < x.0 => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        })
    }

    /// Whether a write to this block must wait (another write to it is in flight).
    pub fn busy(&self, file: u32, offset: u64) -> bool {
        self.block(file, offset).is_some_and(|b| b.inflight)
    }

    /// A write is issued: returns its generation. One write per block in flight: the caller
    /// waits while `busy`.
    pub fn issue(&mut self, file: u32, offset: u64, len: u32) -> u32 {
        let Some(i) = self.table.index(file, offset, len) else {
            return self.overflow.entry((file, offset)).or_default().issue(len);
        };
        let w = self.table.load(i);
        self.written += u64::from(w == 0);
        let mut b = table::decode(w, len);
        let generation = b.issue(len);
        self.table.store(i, table::encode(&b));
        generation
    }

    /// A write completed (with the generation `issue` gave it): acknowledged (`ok`, `dropped`
    /// when the fault swallowed it) or failed.
    pub fn complete(&mut self, file: u32, offset: u64, generation: u32, ok: bool, dropped: bool) {
        let counted = match self.table.index_of(file, offset) {
            Some(i) if self.table.load(i) != 0 => {
                let mut b = table::decode(self.table.load(i), self.table.layout.bs);
                let counted = b.complete(generation, ok, dropped);
                self.table.store(i, table::encode(&b));
                counted
            }
            _ => match self.overflow.get_mut(&(file, offset)) {
                Some(b) => b.complete(generation, ok, dropped),
                None => return,
            },
        };
        self.dropped_writes += u64::from(counted);
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
    check_blocks(
        state.seed,
        state.dropped_writes,
        state.blocks(),
        files,
        names,
    )
}

/// `check` for blocks from anywhere (a state in memory, the records of a saved one), in the
/// order they come.
fn check_blocks(
    seed: u64,
    dropped_writes: u64,
    blocks: impl Iterator<Item = ((u32, u64), Block)>,
    files: &[File],
    names: &[String],
) -> VerifyReport {
    let mut r = VerifyReport {
        dropped_writes,
        ..Default::default()
    };
    let mut buf = Aligned::new(4096);
    for ((file, offset), b) in blocks {
        if b.len as usize > buf.layout.size() {
            buf = Aligned::new(b.len as usize);
        }
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
            judge(read_content(data, file, offset, seed), &b)
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

/// Whether a clone's state can be saved: a file or device volume is only itself, so there is
/// no place beside it the agent may write (the run still verifies everything it wrote; only
/// `lockstep-agent verify` after a restart has nothing to read).
pub fn state_has_a_place(scope: &Scope) -> bool {
    !matches!(scope, Scope::Exact(_))
}

/// Where a clone's state goes: beside its first file, `<job>.<clone>.verify-state`.
pub fn state_path(first_file: &Path, job: &str, clone: u32) -> PathBuf {
    first_file.with_file_name(format!("{job}.{clone}.verify-state"))
}

/// Where a clone's state table goes when it is too large for memory: beside its first file,
/// `<job>.<clone>.verify-table` (unlinked as soon as it is mapped).
pub fn table_path(first_file: &Path, job: &str, clone: u32) -> PathBuf {
    first_file.with_file_name(format!("{job}.{clone}.verify-table"))
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
    // The number of records is known once they are written (a checkpoint reads a table that
    // is still changing), so the header is written with room for any count and the count is
    // put in place at the end (JSON allows the spaces that pad it).
    let header = StateHeader {
        job: job.into(),
        clone,
        seed: state.seed,
        files: files.to_vec(),
        blocks: u64::MAX,
        dropped_writes: state.dropped_writes,
        checkpoint,
    };
    let line = serde_json::to_string(&header).map_err(|e| io(e.into()))?;
    let count_at = STATE_VERSION.len() as u64
        + 1
        + (line
            .find(&format!("\"blocks\":{}", u64::MAX))
            .expect("the header has a block count")
            + "\"blocks\":".len()) as u64;
    writeln!(w, "{STATE_VERSION}").map_err(io)?;
    w.write_all(line.as_bytes()).map_err(io)?;
    w.write_all(b"\n").map_err(io)?;
    let mut count = 0u64;
    for ((file, offset), b) in state.blocks() {
        count += 1;
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
    f.write_all_at(format!("{count:>20}").as_bytes(), count_at)
        .map_err(io)?;
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

/// A state file opened and its header read; the records follow in `reader`.
struct Opened {
    header: StateHeader,
    reader: BufReader<File>,
}

fn open_state(path: &Path) -> Result<Opened, StateError> {
    let p = path.display().to_string();
    let fmt = |problem: String| StateError::Format {
        path: p.clone(),
        problem,
    };
    let ioe = |source| StateError::Io {
        path: p.clone(),
        source,
    };
    let f = File::open(path).map_err(ioe)?;
    let meta = f.metadata().map_err(ioe)?;
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
        .map_err(ioe)?;
    if line.trim_end() != STATE_VERSION {
        return Err(fmt(format!("first line is not '{STATE_VERSION}'")));
    }
    line.clear();
    (&mut r)
        .take(HEADER_LIMIT)
        .read_line(&mut line)
        .map_err(ioe)?;
    let records = meta.len().saturating_sub(r.stream_position().unwrap_or(0)) / 25;
    let header: StateHeader =
        serde_json::from_str(&line).map_err(|e| fmt(format!("header: {e}")))?;
    if header.blocks > records {
        return Err(fmt(format!(
            "the header promises {} records and the file holds {records}",
            header.blocks
        )));
    }
    Ok(Opened { header, reader: r })
}

impl Opened {
    /// The records, one at a time (a state may describe more blocks than fit in memory); the
    /// first bad one ends them and is left in `problem`.
    fn records<'a>(
        &'a mut self,
        path: &'a Path,
        problem: &'a mut Option<StateError>,
    ) -> impl Iterator<Item = ((u32, u64), Block)> + 'a {
        let (total, nfiles) = (self.header.blocks, self.header.files.len());
        let mut i = 0u64;
        std::iter::from_fn(move || {
            if i >= total || problem.is_some() {
                return None;
            }
            let fmt = |problem: String| StateError::Format {
                path: path.display().to_string(),
                problem,
            };
            let mut rec = [0u8; 25];
            if let Err(e) = self.reader.read_exact(&mut rec) {
                *problem = Some(fmt(format!("record {i} of {total}: {e}")));
                return None;
            }
            let le32 = |a: usize| u32::from_le_bytes(rec[a..a + 4].try_into().unwrap());
            let file = le32(0);
            if file as usize >= nfiles {
                *problem = Some(fmt(format!("record {i}: file index {file} out of range")));
                return None;
            }
            i += 1;
            let offset = u64::from_le_bytes(rec[4..12].try_into().unwrap());
            let (len, lo, expect) = (le32(12), le32(16), le32(20));
            let b = Block {
                len,
                issued: expect,
                expect,
                lo,
                inflight: false,
                dropped: rec[24] != 0,
            };
            Some(((file, offset), b))
        })
    }
}

/// Loads a saved state whole (its blocks in a map: for small states and tests; `verify_saved`
/// streams instead).
pub fn load(path: &Path) -> Result<Saved, StateError> {
    let mut opened = open_state(path)?;
    let mut state = VerifyState::new(opened.header.seed);
    state.dropped_writes = opened.header.dropped_writes;
    let mut problem = None;
    state.overflow = opened.records(path, &mut problem).collect();
    if let Some(e) = problem {
        return Err(e);
    }
    let h = opened.header;
    Ok(Saved {
        job: h.job,
        clone: h.clone,
        files: h.files,
        state,
        checkpoint: h.checkpoint,
    })
}

/// Verifies from a saved state: opens the files it names (O_DIRECT when possible, so the read
/// comes from the device rather than the page cache) and checks every block as its record is
/// read, so the memory it takes does not grow with the number of blocks.
pub fn verify_saved(path: &Path) -> Result<VerifyReport, StateError> {
    let mut opened = open_state(path)?;
    let mut files = Vec::new();
    let mut report = VerifyReport::default();
    for name in &opened.header.files {
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
    let (seed, dropped) = (opened.header.seed, opened.header.dropped_writes);
    let (names, checkpoint) = (opened.header.files.clone(), opened.header.checkpoint);
    let mut problem = None;
    let mut r = check_blocks(
        seed,
        dropped,
        opened.records(path, &mut problem),
        &files,
        &names,
    );
    if let Some(e) = problem {
        return Err(e);
    }
    r.state_files.push(if checkpoint {
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
        let b = s.block(0, 0).unwrap();
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
        let b = s.block(0, 0).unwrap();
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
        let b = s.block(0, 4096).unwrap();
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

    /// The state as it was kept before the dense table (one map entry per block), as the
    /// reference the table must agree with.
    #[derive(Default)]
    struct MapModel {
        blocks: std::collections::HashMap<(u32, u64), Block>,
        dropped_writes: u64,
    }

    impl MapModel {
        fn busy(&self, file: u32, offset: u64) -> bool {
            self.blocks.get(&(file, offset)).is_some_and(|b| b.inflight)
        }
        fn issue(&mut self, file: u32, offset: u64, len: u32) -> u32 {
            let b = self.blocks.entry((file, offset)).or_default();
            b.len = len;
            b.issued += 1;
            b.inflight = true;
            b.issued
        }
        fn complete(&mut self, file: u32, offset: u64, generation: u32, ok: bool, dropped: bool) {
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
                b.lo = b.lo.min(b.expect);
                b.expect = generation;
                b.dropped = false;
            }
        }
        fn sorted(&self) -> Vec<((u32, u64), Block)> {
            let mut v: Vec<_> = self.blocks.iter().map(|(k, b)| (*k, *b)).collect();
            v.sort_by_key(|(k, _)| *k);
            v
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A write to (file, block slot, unaligned): slots past the region and file 2 (not
        /// in the layout) and unaligned offsets have no place in the table.
        Issue(u32, u64, bool),
        /// Completes the n-th write in flight (if any): acknowledged, dropped.
        Complete(usize, bool, bool),
        Check,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u32..3, 0u64..12, proptest::bool::weighted(0.1))
                .prop_map(|(f, k, u)| Op::Issue(f, k, u)),
            4 => (0usize..8, proptest::bool::weighted(0.8), proptest::bool::weighted(0.2))
                .prop_map(|(n, ok, d)| Op::Complete(n, ok, d)),
            1 => Just(Op::Check),
        ]
    }

    fn same(s: &VerifyState, m: &MapModel) {
        let got: Vec<_> = s.blocks().collect();
        assert_eq!(got, m.sorted());
        assert_eq!(s.len(), m.blocks.len() as u64);
        assert_eq!(s.dropped_writes, m.dropped_writes);
        let view = s.live_view();
        assert_eq!(view.blocks().collect::<Vec<_>>(), got);
        for f in 0..3u32 {
            for k in 0..12u64 {
                for off in [k * 4096, k * 4096 + 512] {
                    assert_eq!(s.busy(f, off), m.busy(f, off), "busy {f}@{off}");
                    assert_eq!(s.block(f, off), m.blocks.get(&(f, off)).copied());
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// For any sequence of writes issued (one per block in flight, as the runner holds a
        /// second), completed (acknowledged, dropped or failed) and checked, the dense state,
        /// in memory or in its file, says exactly what the map said, block by block, in the
        /// same order, and saves the same records.
        #[test]
        fn the_dense_state_behaves_like_the_map(
            ops in proptest::collection::vec(op(), 1..200),
            on_disk: bool,
        ) {
            let dir = tempfile::tempdir().unwrap();
            // File 0: 8 whole blocks and a tail; file 1: 5 blocks from 12 KiB on.
            let layout = Layout::new(4096, &[(0, 8 * 4096 + 100), (3 * 4096, 5 * 4096)]);
            let spill = Spill {
                scope: Scope::Beneath(dir.path().to_path_buf()),
                path: dir.path().join("j.0.verify-table"),
            };
            let limit = if on_disk { 0 } else { IN_MEMORY_LIMIT };
            let mut s = VerifyState::for_layout(SEED, layout, Some(&spill), limit).unwrap();
            assert_eq!(s.spilled_to().is_some(), on_disk);
            let mut m = MapModel::default();
            let mut inflight: Vec<(u32, u64, u32)> = Vec::new();
            for op in ops {
                match op {
                    Op::Issue(f, k, unaligned) => {
                        let off = k * 4096 + if unaligned { 512 } else { 0 };
                        if m.busy(f, off) {
                            continue;
                        }
                        let g = s.issue(f, off, 4096);
                        assert_eq!(g, m.issue(f, off, 4096));
                        inflight.push((f, off, g));
                    }
                    Op::Complete(n, ok, dropped) => {
                        if inflight.is_empty() {
                            continue;
                        }
                        let (f, off, g) = inflight.remove(n % inflight.len());
                        s.complete(f, off, g, ok, ok && dropped);
                        m.complete(f, off, g, ok, ok && dropped);
                    }
                    Op::Check => same(&s, &m),
                }
            }
            same(&s, &m);
            let names = vec!["a".to_string(), "b".to_string(), "c".to_string()];
            for checkpoint in [false, true] {
                let sp = dir.path().join("j.0.verify-state");
                let sc = Scope::Named;
                if checkpoint {
                    save_checkpoint(&sc, &sp, "j", 0, &names, &s).unwrap();
                } else {
                    save(&sc, &sp, "j", 0, &names, &s).unwrap();
                }
                let saved: Vec<_> = load(&sp).unwrap().state.blocks().collect();
                let want: Vec<_> = m
                    .sorted()
                    .into_iter()
                    .map(|(k, b)| {
                        let expect = match (checkpoint, b.inflight) {
                            (true, _) => ANY_LATER,
                            (false, true) => b.issued,
                            (false, false) => b.expect,
                        };
                        let lo = if b.inflight { b.lo.min(b.expect) } else { b.lo };
                        let b = Block { issued: expect, expect, lo, inflight: false, ..b };
                        (k, b)
                    })
                    .collect();
                proptest::prop_assert_eq!(saved, want);
            }
        }
    }

    /// A table larger than the memory limit goes to a file beside the job's files, inside the
    /// volume, which is unlinked at once (nothing left even if the agent is killed) and whose
    /// mapping goes with the state; a link planted at its name is replaced, never followed.
    #[test]
    fn a_large_table_goes_to_a_file_inside_the_volume_and_leaves_nothing() {
        let vol = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let path = table_path(&vol.path().join("w.0.0"), "w", 0);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let spill = Spill {
            scope: Scope::Beneath(vol.path().to_path_buf()),
            path: path.clone(),
        };
        // 64 GiB in 4 KiB blocks: 128 MiB of table.
        let layout = Layout::new(4096, &[(0, 64 << 30)]);
        let maps = || std::fs::read_to_string("/proc/self/maps").unwrap();
        let mapped = format!("{} (deleted)", path.display());
        {
            let mut s =
                VerifyState::for_layout(SEED, layout.clone(), Some(&spill), 1 << 20).unwrap();
            assert_eq!(s.spilled_to(), Some(path.as_path()));
            assert!(
                maps().contains(&mapped),
                "the table is mapped from {mapped}"
            );
            assert!(path.starts_with(vol.path()));
            assert_eq!(std::fs::read_dir(vol.path()).unwrap().count(), 0);
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
            let last = (64u64 << 30) - 4096;
            for off in [0, 4096 * 1000, last] {
                let g = s.issue(0, off, 4096);
                s.complete(0, off, g, true, off == last);
            }
            let offsets: Vec<u64> = s.blocks().map(|((_, o), _)| o).collect();
            assert_eq!(offsets, [0, 4096 * 1000, last]);
            assert_eq!(s.dropped_writes, 1);
        }
        assert!(!maps().contains(&mapped), "unmapped with the state");
        // Under the limit, or with nowhere to put it, it stays in memory.
        let s = VerifyState::for_layout(SEED, layout.clone(), Some(&spill), 4 << 30).unwrap();
        assert_eq!(s.spilled_to(), None);
        let s = VerifyState::for_layout(SEED, layout, None, 1 << 20).unwrap();
        assert_eq!(s.spilled_to(), None);
    }

    /// The write after the last generation starts the block over (the wrap rule).
    #[test]
    fn generations_wrap_to_one_and_the_block_starts_over() {
        let mut s =
            VerifyState::for_layout(SEED, Layout::new(4096, &[(0, 4096)]), None, IN_MEMORY_LIMIT)
                .unwrap();
        let w = table::encode(&Block {
            len: 4096,
            issued: GEN_MAX,
            expect: GEN_MAX,
            lo: GEN_MAX,
            inflight: false,
            dropped: false,
        });
        s.table.store(0, w);
        s.written = 1;
        let g = s.issue(0, 0, 4096);
        assert_eq!(g, 1);
        let b = s.block(0, 0).unwrap();
        assert_eq!((b.issued, b.expect, b.lo, b.inflight), (1, 0, 0, true));
        s.complete(0, 0, g, true, false);
        let b = s.block(0, 0).unwrap();
        assert_eq!((b.expect, b.lo), (1, 1));
        assert_eq!(s.len(), 1);
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
