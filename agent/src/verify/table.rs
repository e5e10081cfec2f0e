//! The verify state's table: one 8-byte word per block of the clone's layout, indexed by
//! (file, block number), in memory while small and in a file on the volume beyond that.
//!
//! Why a dense table: the state used to be a hash map entry per written block (about 60 bytes
//! each with the map's own overhead), so a 1 TiB volume in 4 KiB blocks needed tens of GB and
//! grew for as long as a random workload kept finding new blocks. The layout (files, their
//! regions, the one write block size) is known before the first IO, so every block has a fixed
//! place and the table's size is known, and checked, before the run starts.
//!
//! What a block needs (see `Block`), packed in one `u64`:
//! - bits 0..32: `issued`, the generation of the last write issued (0: never written);
//! - bits 32..62: `expect - lo`, the writes that failed since the last acknowledged one, or
//!   `LO_NONE` when no write to the block was ever acknowledged (`lo == 0`);
//! - bit 62: a write is in flight; bit 63: the last acknowledged write was dropped by a fault.
//!
//! `expect` is not stored: with one write per block in flight (the runner holds a second one),
//! the last completed write is always the last issued one, so `expect == issued - inflight`.
//! More than 2^30 - 2 failed writes in a row on one block (never seen: every one is an IO
//! error) are kept as "never acknowledged", which accepts more, never less.
//!
//! The words are atomics so that a checkpoint thread can read the table while the IO thread
//! goes on writing it (see `VerifyState::live_view`); each word is written by one thread only.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::confine::{self, Scope};

use super::Block;

/// A table up to this size stays in the agent's memory: 64 MiB holds 8M blocks (a 32 GiB
/// file in 4 KiB blocks), which covers the usual verifying job with no extra file on the
/// volume and no writeback of the table competing with the IO being measured, while 32
/// clones of that size still fit in a small host's memory. A larger table goes to a file on
/// the volume (the only place the agent may write), where the page cache holds what is hot.
pub const IN_MEMORY_LIMIT: u64 = 64 << 20;

/// Bytes of state per block of the layout.
pub const BYTES_PER_BLOCK: u64 = 8;

const DELTA_SHIFT: u32 = 32;
/// The delta field's value for "no write was ever acknowledged" (`lo == 0`).
const LO_NONE: u64 = (1 << 30) - 1;
const INFLIGHT: u64 = 1 << 62;
const DROPPED: u64 = 1 << 63;

/// Packs a block's state (its length is the table's).
pub(super) fn encode(b: &Block) -> u64 {
    debug_assert_eq!(
        b.issued,
        b.expect + u32::from(b.inflight),
        "one write in flight per block"
    );
    let delta = if b.lo == 0 {
        LO_NONE
    } else {
        u64::from(b.expect - b.lo).min(LO_NONE)
    };
    u64::from(b.issued)
        | delta << DELTA_SHIFT
        | if b.inflight { INFLIGHT } else { 0 }
        | if b.dropped { DROPPED } else { 0 }
}

pub(super) fn decode(w: u64, len: u32) -> Block {
    let issued = w as u32;
    let inflight = w & INFLIGHT != 0;
    let expect = issued - u32::from(inflight);
    let delta = (w >> DELTA_SHIFT) & LO_NONE;
    Block {
        len,
        issued,
        expect,
        lo: if delta == LO_NONE {
            0
        } else {
            expect - delta as u32
        },
        inflight,
        dropped: w & DROPPED != 0,
    }
}

/// The blocks a verifying clone may write: one write block size, and per file the region's
/// start and its number of whole blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub bs: u32,
    /// Per file index: (region start, blocks in the region).
    pub files: Vec<(u64, u64)>,
}

impl Layout {
    /// From the clone's regions `(offset, len)`: the generator starts IOs at multiples of the
    /// smallest block size from a region's start, and every IO fits in the region.
    pub fn new(bs: u32, regions: &[(u64, u64)]) -> Self {
        let bs = bs.max(1);
        Layout {
            bs,
            files: regions
                .iter()
                .map(|&(off, len)| (off, len / u64::from(bs)))
                .collect(),
        }
    }

    pub fn blocks(&self) -> u64 {
        self.files.iter().map(|f| f.1).fold(0, u64::saturating_add)
    }

    pub fn table_bytes(&self) -> u64 {
        self.blocks().saturating_mul(BYTES_PER_BLOCK)
    }
}

/// Where a table too large for memory may go: a file inside the volume, reached through the
/// volume's scope. `None` (a volume that is one file or device) keeps the table in memory.
#[derive(Debug, Clone)]
pub struct Spill {
    pub scope: Scope,
    pub path: PathBuf,
}

/// Memory a clone's table takes, for the budget: all of it in memory up to the limit, or
/// when there is nowhere on the volume to put it.
pub fn memory_bytes(layout_bytes: u64, can_spill: bool) -> u64 {
    if can_spill && layout_bytes > IN_MEMORY_LIMIT {
        0
    } else {
        layout_bytes
    }
}

/// The words, in memory or mapped from a file.
enum Words {
    Memory(Box<[AtomicU64]>),
    Mapped(Mapping),
}

impl Words {
    fn get(&self) -> &[AtomicU64] {
        match self {
            Words::Memory(w) => w,
            Words::Mapped(m) => m.words(),
        }
    }
}

/// A zeroed table taken from the allocator as zeroed memory, so the kernel hands out its pages
/// on first touch: only the pages of blocks written cost resident memory.
fn zeroed(words: usize) -> Box<[AtomicU64]> {
    if words == 0 {
        return Box::new([]);
    }
    let layout = std::alloc::Layout::array::<AtomicU64>(words).expect("verify table layout");
    // SAFETY: non-zero size; all-zero bytes are a valid `AtomicU64`; the box frees it with
    // the same layout (that of `[AtomicU64]` of this length).
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut AtomicU64;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, words))
    }
}

/// A shared read-write mapping of an unlinked file (the file is gone from the directory as
/// soon as it is mapped, so nothing is left on the volume even when the agent is killed).
struct Mapping {
    ptr: *mut libc::c_void,
    bytes: usize,
    words: usize,
    /// Where the file was, for messages and tests.
    path: PathBuf,
}

// SAFETY: the mapping is only ever accessed as atomics.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: page-aligned mapping of `bytes >= words * 8` bytes, alive as long as self,
        // accessed only through atomics.
        unsafe { std::slice::from_raw_parts(self.ptr as *const AtomicU64, self.words) }
    }

    /// Creates the file beside the job's files through the volume's scope (the same confined
    /// open as the state file: no link followed, no file with a second hard link written),
    /// allocates it, maps it and unlinks it.
    fn create(spill: &Spill, words: usize) -> io::Result<Mapping> {
        let bytes = words
            .checked_mul(BYTES_PER_BLOCK as usize)
            .ok_or_else(|| io::Error::other("verify table too large"))?
            .max(1);
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let file = match spill.scope.open(&spill.path, flags, 0o600) {
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && spill.scope.owns_existing_files() =>
            {
                // Inside a volume, left by an agent killed between creating and unlinking it:
                // ours to replace (removal through the scope removes a planted link, not its
                // target). A path a local job file names is not removed: the error says so.
                spill.scope.remove(&spill.path)?;
                spill.scope.open(&spill.path, flags, 0o600)?
            }
            other => other?,
        };
        let result = (|| {
            confine::check_private(&spill.path, &file)?;
            use std::os::fd::AsRawFd;
            // The blocks are allocated now: a page of a shared mapping that the filesystem
            // cannot allocate when it is first written kills the process with SIGBUS, so a
            // full volume must be an error here, before the run. Filesystems without
            // fallocate (some network and FUSE ones) get a sparse file.
            // SAFETY: plain syscall on a descriptor we own.
            let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                    return Err(e);
                }
                file.set_len(bytes as u64)?;
            }
            // SAFETY: a new shared mapping of a file we just sized; checked for failure.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            Ok(Mapping {
                ptr,
                bytes,
                words,
                path: spill.path.clone(),
            })
        })();
        // The mapping keeps the data; the name goes now, whatever happened.
        let removed = spill.scope.remove(&spill.path);
        let m = result?;
        removed?;
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `create` mapped. No writeback is needed: the file is
        // unlinked and its blocks are freed with the last reference.
        unsafe { libc::munmap(self.ptr, self.bytes) };
    }
}

/// Words per 4 KiB page of the table.
const PAGE_WORDS: usize = 512;

/// The table and a bitmap of its pages that hold a written block: a pass over the written
/// blocks (check, save, checkpoint) skips the untouched pages instead of reading them, which
/// would fault in page cache (or zero pages) for the whole table of a sparsely written volume.
/// The bitmap is 1/32768 of the table (64 KiB for 1 TiB in 4 KiB blocks).
struct Shared {
    words: Words,
    pages: Box<[AtomicU64]>,
}

impl Shared {
    #[inline]
    fn page_written(&self, word: usize) -> bool {
        let p = word / PAGE_WORDS;
        self.pages[p / 64].load(Ordering::Acquire) & (1 << (p % 64)) != 0
    }
}

/// The dense part of a verify state.
#[derive(Clone)]
pub(super) struct Table {
    pub layout: Layout,
    /// Per file: the index of its first block in `words`.
    first: Vec<u64>,
    shared: Arc<Shared>,
}

impl Table {
    /// In memory when the table is at most `memory_limit` bytes or `spill` is `None`.
    pub fn new(layout: Layout, spill: Option<&Spill>, memory_limit: u64) -> io::Result<Table> {
        let mut first = Vec::with_capacity(layout.files.len());
        let mut n = 0u64;
        for &(_, blocks) in &layout.files {
            first.push(n);
            n = n.saturating_add(blocks);
        }
        let words = usize::try_from(n).map_err(|_| io::Error::other("verify table too large"))?;
        let words = match spill {
            Some(spill) if layout.table_bytes() > memory_limit => {
                Words::Mapped(Mapping::create(spill, words)?)
            }
            _ => Words::Memory(zeroed(words)),
        };
        let n = words.get().len().div_ceil(PAGE_WORDS).div_ceil(64);
        Ok(Table {
            layout,
            first,
            shared: Arc::new(Shared {
                words,
                pages: (0..n).map(|_| AtomicU64::new(0)).collect(),
            }),
        })
    }

    /// The word index of a block, when it is one of the layout's (aligned, whole, the
    /// table's length).
    #[inline]
    pub fn index(&self, file: u32, offset: u64, len: u32) -> Option<usize> {
        let &(base, blocks) = self.layout.files.get(file as usize)?;
        let bs = u64::from(self.layout.bs);
        let rel = offset.checked_sub(base)?;
        if len != self.layout.bs || rel % bs != 0 || rel / bs >= blocks {
            return None;
        }
        Some((self.first[file as usize] + rel / bs) as usize)
    }

    /// Like `index`, for a lookup that does not know the length (the table's is assumed).
    #[inline]
    pub fn index_of(&self, file: u32, offset: u64) -> Option<usize> {
        self.index(file, offset, self.layout.bs)
    }

    #[inline]
    pub fn load(&self, i: usize) -> u64 {
        self.shared.words.get()[i].load(Ordering::Relaxed)
    }

    #[inline]
    pub fn store(&self, i: usize, w: u64) {
        self.shared.words.get()[i].store(w, Ordering::Relaxed);
        // Marked after the word is written (release): a reader that sees the mark sees the
        // word. Blocks written before a checkpoint thread started are seen in any case.
        let p = i / PAGE_WORDS;
        let (cell, bit) = (&self.shared.pages[p / 64], 1u64 << (p % 64));
        if cell.load(Ordering::Relaxed) & bit == 0 {
            cell.fetch_or(bit, Ordering::Release);
        }
    }

    /// Written blocks in (file, offset) order, read one word at a time (a checkpoint reads
    /// while the IO thread writes: each block is seen as it was at some instant).
    pub fn iter(&self) -> impl Iterator<Item = ((u32, u64), Block)> + '_ {
        let shared = &*self.shared;
        let words = shared.words.get();
        let bs = self.layout.bs;
        // Position: file `f`, block `i` of its region.
        let (mut f, mut i) = (0usize, 0u64);
        std::iter::from_fn(move || {
            loop {
                let &(base, blocks) = self.layout.files.get(f)?;
                if i >= blocks {
                    (f, i) = (f + 1, 0);
                    continue;
                }
                let at = (self.first[f] + i) as usize;
                if !shared.page_written(at) {
                    i += (PAGE_WORDS - at % PAGE_WORDS) as u64;
                    continue;
                }
                i += 1;
                let w = words[at].load(Ordering::Relaxed);
                if w != 0 {
                    return Some(((f as u32, base + (i - 1) * u64::from(bs)), decode(w, bs)));
                }
            }
        })
    }

    /// Where the table's file was (`None` in memory).
    pub fn spilled_to(&self) -> Option<&Path> {
        match &self.shared.words {
            Words::Memory(_) => None,
            Words::Mapped(m) => Some(&m.path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_every_reachable_shape() {
        let shapes = [
            (0, 0, 0, false, false),
            (1, 0, 0, true, false),
            (1, 1, 1, false, true),
            (7, 6, 3, true, false),
            (7, 7, 0, false, false),
            (u32::MAX - 1, u32::MAX - 1, u32::MAX - 4, false, false),
        ];
        for (issued, expect, lo, inflight, dropped) in shapes {
            let b = Block {
                len: 4096,
                issued,
                expect,
                lo,
                inflight,
                dropped,
            };
            assert_eq!(decode(encode(&b), 4096), b);
        }
        // A billion failed writes in a row: kept as never acknowledged (accepts more).
        let b = Block {
            len: 4096,
            issued: u32::MAX - 1,
            expect: u32::MAX - 1,
            lo: 5,
            inflight: false,
            dropped: false,
        };
        assert_eq!(decode(encode(&b), 4096), Block { lo: 0, ..b });
    }

    #[test]
    fn only_aligned_whole_blocks_of_the_layout_have_a_place() {
        let layout = Layout::new(4096, &[(0, 3 * 4096 + 100), (8192, 2 * 4096)]);
        let t = Table::new(layout, None, IN_MEMORY_LIMIT).unwrap();
        assert_eq!(t.index(0, 0, 4096), Some(0));
        assert_eq!(t.index(0, 2 * 4096, 4096), Some(2));
        assert_eq!(t.index(0, 3 * 4096, 4096), None);
        assert_eq!(t.index(0, 100, 4096), None);
        assert_eq!(t.index(0, 0, 512), None);
        assert_eq!(t.index(1, 0, 4096), None);
        assert_eq!(t.index(1, 8192 + 4096, 4096), Some(4));
        assert_eq!(t.index(2, 0, 4096), None);
    }
}
