//! Writes a run's data files while the run goes on, on a thread of its own: the run loop hands
//! over each agent's interval (already merged) and goes on; compression and disk writes use the
//! other core, and the run's memory holds only what is queued.
//!
//! A full or failing results disk must not end the run (its report still reaches stdout): the
//! first write error is kept for the end and later writes are dropped.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::format::{
    HISTOGRAMS_MAGIC, INDEX_MAGIC, IndexEntry, POINT_SIZE, PointsHeader, RECORD_HEADER, Tag,
    push_record,
};
use super::{HISTOGRAMS, INDEX, Manifest, POINTS};
use lockstep_proto::v1::VolumeInterval;

/// zstd's fastest levels already take most of what there is to take from histograms (their
/// counts are noise); a higher level costs CPU the coordinator needs for merging.
const ZSTD_LEVEL: i32 = 1;

/// How many bytes of agent reports may wait for the disk. Beyond it the run loop waits, so
/// memory stays bounded when the disk is slower than the agents. Bounded by bytes, not by
/// reports: a bound of 4,096 reports let the queue (and what the allocator keeps of it after)
/// reach 64 MiB at 8 volumes an agent, which was most of a long run's memory (docs/scale.md).
/// 16 MiB is a few seconds of 1,000 agents x 8 volumes at 2 digits, and the writer needs well
/// under a second of CPU for each second of them.
const QUEUE_BYTES: usize = 16 << 20;

/// The size of the record buffers the queue starts with: 8 volumes' histograms at 2 digits
/// (about 10 KiB) fit, and a larger report grows the buffer it gets once.
const BUFFER: usize = 16 << 10;
/// How many buffers the queue starts with and keeps for recycling.
const BUFFERS: usize = QUEUE_BYTES / BUFFER;

/// The bytes queued for the disk, a wait for room, and the record buffers coming back from
/// the disk to be used again. The buffers are the queue's memory, allocated and touched when
/// the run starts: freed after each write, the memory the allocator kept grew in steps
/// whenever the disk fell behind (38 MiB after 2.4 hours of a 12-hour run against 25 MiB after
/// its first minute), while recycled it is the same from the first minute to the last.
struct Backlog {
    /// Bytes queued, and whether the writer thread has ended (then nothing waits for room).
    bytes: Mutex<(usize, bool)>,
    room: Condvar,
    free: Mutex<Vec<Vec<u8>>>,
}

/// Marks the backlog closed when the writer thread ends, by returning or by a panic: a run
/// loop waiting for room would otherwise wait for ever.
struct CloseOnExit(Arc<Backlog>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        let mut queued = self.0.bytes.lock().unwrap_or_else(|e| e.into_inner());
        queued.1 = true;
        self.0.room.notify_all();
    }
}

impl Backlog {
    fn new() -> Self {
        let free = (0..BUFFERS)
            .map(|_| {
                let mut b = vec![0u8; BUFFER];
                b.clear();
                b
            })
            .collect();
        Backlog {
            bytes: Mutex::new((0, false)),
            room: Condvar::new(),
            free: Mutex::new(free),
        }
    }

    /// A cleared buffer with room for `len` bytes, recycled when one is free.
    fn buffer(&self, len: usize) -> Vec<u8> {
        let b = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut b = b.unwrap_or_default();
        b.reserve_exact(len);
        b
    }

    /// Takes a written block's buffer back, unless the free list already holds the queue's
    /// worth of them.
    fn recycle(&self, mut b: Vec<u8>) {
        b.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < BUFFERS {
            free.push(b);
        }
    }

    /// Waits until `n` more bytes fit (a report larger than the whole budget waits for an
    /// empty queue), then counts them.
    fn take(&self, n: usize) {
        let mut queued = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        while !queued.1 && queued.0 > 0 && queued.0 + n > QUEUE_BYTES {
            queued = self.room.wait(queued).unwrap_or_else(|e| e.into_inner());
        }
        queued.0 += n;
    }

    fn give_back(&self, n: usize) {
        let mut queued = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        queued.0 = queued.0.saturating_sub(n);
        self.room.notify_all();
    }
}

/// One volume's histograms as they go into a block's records: each non-empty one with its tag.
fn histograms_of(vi: &VolumeInterval) -> impl Iterator<Item = (Tag, &[u8])> {
    [(0u8, &vi.read), (1, &vi.write)]
        .into_iter()
        .filter_map(|(dir, d)| Some((dir, d.as_ref()?)))
        .flat_map(|(dir, d)| {
            [(false, &d.lat_hist), (true, &d.lat_intended_hist)]
                .map(|(intended, bytes)| (Tag { dir, intended }, bytes.as_slice()))
        })
        .filter(|(_, bytes)| !bytes.is_empty())
}

/// The bytes one volume's histograms take in a block's records (`format::push_record`).
pub fn records_len(vi: &VolumeInterval) -> usize {
    histograms_of(vi)
        .map(|(_, b)| RECORD_HEADER + b.len())
        .sum()
}

/// One agent's report of one interval, ready for the disk.
pub struct ReportBlock {
    pub interval: u64,
    pub len_ms: u32,
    pub first_volume: u32,
    pub volumes: u32,
    /// Uncompressed records (`format::push_record`).
    pub records: Vec<u8>,
    /// The volumes' points, `POINT_SIZE` bytes each, for volumes `first_volume..`.
    pub points: Vec<u8>,
}

impl ReportBlock {
    /// A block for `volumes` of one agent, its records growing as they are added (a run takes
    /// its blocks from `StoreWriter::block`, in recycled buffers sized for them).
    pub fn new(interval: u64, len_ms: u32, first_volume: u32, volumes: u32) -> Self {
        ReportBlock {
            interval,
            len_ms,
            first_volume,
            volumes,
            records: Vec::new(),
            points: vec![0u8; volumes as usize * POINT_SIZE],
        }
    }

    /// Adds one volume's histograms, as the agent sent them.
    pub fn add(&mut self, volume: u32, vi: &VolumeInterval) {
        for (tag, bytes) in histograms_of(vi) {
            push_record(&mut self.records, volume, tag, bytes);
        }
    }

    /// What the block holds in memory while it waits for the disk.
    fn size(&self) -> usize {
        self.records.capacity() + self.points.capacity() + std::mem::size_of::<Self>()
    }

    /// Adds one volume's point.
    pub fn add_point(&mut self, volume: u32, point: &[u8; POINT_SIZE]) {
        let at = (volume - self.first_volume) as usize * POINT_SIZE;
        if let Some(slot) = self.points.get_mut(at..at + POINT_SIZE) {
            slot.copy_from_slice(point);
        }
    }
}

/// What the writer wrote, for the end of the run.
#[derive(Debug, Default, Clone)]
pub struct StoreStats {
    pub blocks: u64,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    /// The first write error, if any (later writes were dropped).
    pub error: Option<String>,
}

pub struct StoreWriter {
    tx: Option<Sender<ReportBlock>>,
    backlog: Arc<Backlog>,
    thread: Option<JoinHandle<StoreStats>>,
    pub dir: PathBuf,
}

fn create(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Never through a link left in the results directory.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl StoreWriter {
    /// Creates `dir` (the run's `data/`) with its manifest and empty data files, and starts the
    /// writer thread.
    pub fn create(dir: &Path, manifest: &Manifest) -> io::Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let json = serde_json::to_vec_pretty(manifest).map_err(io::Error::other)?;
        lockstep_core::atomic_file::write_atomically(&dir.join(super::MANIFEST), &json)?;
        let mut hist = create(&dir.join(HISTOGRAMS))?;
        hist.write_all(HISTOGRAMS_MAGIC)?;
        let mut index = create(&dir.join(INDEX))?;
        index.write_all(INDEX_MAGIC)?;
        let points = create(&dir.join(POINTS))?;
        let header = PointsHeader {
            volumes: manifest.volumes.len() as u32,
            interval_ms: manifest.interval_ms as u32,
        };
        points.write_all_at(&header.to_bytes(), 0)?;
        let (tx, rx) = channel();
        let backlog = Arc::new(Backlog::new());
        let files = Files {
            hist,
            hist_len: HISTOGRAMS_MAGIC.len() as u64,
            index: io::BufWriter::with_capacity(1 << 16, index),
            points,
            header,
            compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL)?,
            stats: StoreStats::default(),
            backlog: backlog.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("lockstep-store".into())
            .spawn(move || {
                let _closed = CloseOnExit(files.backlog.clone());
                files.run(rx)
            })?;
        Ok(StoreWriter {
            tx: Some(tx),
            backlog,
            thread: Some(thread),
            dir: dir.to_path_buf(),
        })
    }

    /// A block for `volumes` of one agent with room for `records_len` bytes of records (the
    /// sum of their `records_len`), in a buffer the queue recycles.
    pub fn block(
        &self,
        interval: u64,
        len_ms: u32,
        first_volume: u32,
        volumes: u32,
        records_len: usize,
    ) -> ReportBlock {
        ReportBlock {
            records: self.backlog.buffer(records_len),
            ..ReportBlock::new(interval, len_ms, first_volume, volumes)
        }
    }

    /// Queues one agent's interval; waits only when the disk is `QUEUE_BYTES` behind.
    pub fn write(&self, block: ReportBlock) {
        if let Some(tx) = &self.tx {
            self.backlog.take(block.size());
            // A closed channel means the thread ended (it only does after `finish`).
            let _ = tx.send(block);
        }
    }

    /// Writes what is queued and closes the files.
    pub fn finish(mut self) -> StoreStats {
        self.tx.take();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_else(|| StoreStats {
                error: Some("the data writer thread panicked".into()),
                ..Default::default()
            })
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Files {
    hist: File,
    hist_len: u64,
    index: io::BufWriter<File>,
    points: File,
    header: PointsHeader,
    compressor: zstd::bulk::Compressor<'static>,
    stats: StoreStats,
    backlog: Arc<Backlog>,
}

impl Files {
    fn run(mut self, rx: Receiver<ReportBlock>) -> StoreStats {
        for block in rx {
            if self.stats.error.is_none()
                && let Err(e) = self.write(&block)
            {
                self.stats.error = Some(e.to_string());
            }
            let size = block.size();
            self.backlog.recycle(block.records);
            self.backlog.give_back(size);
        }
        if self.stats.error.is_none() {
            let flushed = self
                .index
                .flush()
                .and_then(|()| self.hist.sync_data())
                .and_then(|()| self.points.sync_data());
            if let Err(e) = flushed {
                self.stats.error = Some(e.to_string());
            }
        }
        self.stats
    }

    fn write(&mut self, b: &ReportBlock) -> io::Result<()> {
        if !b.records.is_empty() {
            let packed = self.compressor.compress(&b.records)?;
            self.hist.write_all(&packed)?;
            let entry = IndexEntry {
                interval: b.interval as u32,
                len_ms: b.len_ms,
                first_volume: b.first_volume,
                volumes: b.volumes,
                offset: self.hist_len,
                len: packed.len() as u32,
                crc: crc32c::crc32c(&packed),
            };
            self.hist_len += packed.len() as u64;
            self.index.write_all(&entry.to_bytes())?;
            self.stats.blocks += 1;
            self.stats.raw_bytes += b.records.len() as u64;
            self.stats.stored_bytes += packed.len() as u64;
        }
        let at = self.header.offset(b.interval, b.first_volume);
        self.points.write_all_at(&b.points, at)
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::Record;
    use super::super::{DATA_DIR, StoreReader, StoredVolume};
    use super::*;
    use lockstep_proto::v1::DirInterval;

    fn volume_interval(fill: u8, len: usize) -> VolumeInterval {
        VolumeInterval {
            read: Some(DirInterval {
                lat_hist: vec![fill; len],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// More blocks than the queue's buffers, of varying sizes, each with its own bytes: every
    /// recycled buffer is cleared and sized for the block it carries next.
    #[test]
    fn recycled_buffers_carry_each_block_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let vols = vec![StoredVolume {
            node: "n".into(),
            volume: "v".into(),
            role: "r".into(),
        }];
        let w =
            StoreWriter::create(&dir.path().join(DATA_DIR), &Manifest::new(1000, vols)).unwrap();
        let blocks = 3 * BUFFERS;
        let len = |i: usize| 100 + (i * 7919) % (3 * BUFFER);
        for i in 0..blocks {
            let vi = volume_interval(i as u8, len(i));
            let mut b = w.block(i as u64, 1000, 0, 1, records_len(&vi));
            b.add(0, &vi);
            assert_eq!(b.records.len(), records_len(&vi));
            w.write(b);
        }
        let stats = w.finish();
        assert_eq!((stats.error, stats.blocks), (None, blocks as u64));
        let r = StoreReader::open(dir.path()).unwrap();
        let data = std::fs::read(dir.path().join(DATA_DIR).join(HISTOGRAMS)).unwrap();
        let mut n = 0;
        for e in r.index().unwrap() {
            let e = e.unwrap();
            let packed = &data[e.offset as usize..e.offset as usize + e.len as usize];
            let raw = zstd::bulk::decompress(packed, 1 << 20).unwrap();
            let records: Vec<Record<'_>> = super::super::format::records(&raw)
                .collect::<Result<_, _>>()
                .unwrap();
            let i = e.interval as usize;
            assert_eq!(records.len(), 1);
            assert_eq!(
                records[0].bytes,
                vec![i as u8; len(i)].as_slice(),
                "block {i}"
            );
            n += 1;
        }
        assert_eq!(n, blocks);
    }

    #[test]
    fn a_full_queue_waits_for_room_and_never_for_a_writer_that_ended() {
        let backlog = Arc::new(Backlog::new());
        backlog.take(QUEUE_BYTES);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiting = backlog.clone();
        let t = std::thread::spawn(move || {
            waiting.take(1);
            done_tx.send(()).unwrap();
        });
        // Full: the second report waits...
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_millis(200))
                .is_err()
        );
        // ...until the writer gives room back.
        backlog.give_back(QUEUE_BYTES);
        done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        t.join().unwrap();
        backlog.give_back(1);
        // A writer thread that ended (or panicked) closes the queue: nothing waits after.
        backlog.take(QUEUE_BYTES);
        drop(CloseOnExit(backlog.clone()));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let closed = backlog.clone();
        std::thread::spawn(move || {
            closed.take(QUEUE_BYTES);
            done_tx.send(()).unwrap();
        });
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .is_ok(),
            "a report waited on a closed queue"
        );
    }
}
