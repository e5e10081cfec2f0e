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
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    bytes: Mutex<Queued>,
    room: Condvar,
    free: Mutex<Vec<Vec<u8>>>,
}

/// What the backlog's lock guards.
#[derive(Default)]
struct Queued {
    bytes: usize,
    /// The writer thread has ended: nothing waits for room any more.
    closed: bool,
    /// Run loops waiting for room (none, nearly always: then nobody is notified).
    waiting: usize,
}

/// Marks the backlog closed when the writer thread ends, by returning or by a panic: a run
/// loop waiting for room would otherwise wait for ever.
struct CloseOnExit(Arc<Backlog>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        let mut queued = self.0.bytes.lock().unwrap_or_else(|e| e.into_inner());
        queued.closed = true;
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
            bytes: Mutex::new(Queued::default()),
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
        while !queued.closed && queued.bytes > 0 && queued.bytes + n > QUEUE_BYTES {
            queued.waiting += 1;
            queued = self.room.wait(queued).unwrap_or_else(|e| e.into_inner());
            queued.waiting -= 1;
        }
        queued.bytes += n;
    }

    fn give_back(&self, n: usize) {
        let mut queued = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        queued.bytes = queued.bytes.saturating_sub(n);
        // A notify is a system call whether or not anyone waits: one per report had been a
        // good part of the coordinator's futex time at 5,000 agents.
        if queued.waiting > 0 {
            self.room.notify_all();
        }
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
    /// Agent reports with histograms (index entries).
    pub blocks: u64,
    /// zstd frames they went into.
    pub frames: u64,
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
            index,
            points,
            header,
            compressor: zstd::bulk::Compressor::new(ZSTD_LEVEL)?,
            stats: StoreStats::default(),
            backlog: backlog.clone(),
            batch: Batch::default(),
            frame: Frame::default(),
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

/// Bytes of compressed histograms gathered before they go to the file in one write: one write
/// per agent report was two system calls per agent and interval, 20,000 a second at 10,000
/// agents (docs/scale.md#batched-writes).
const BATCH_BYTES: usize = 1 << 20;

/// Points gathered before they are written: more than one interval of 10,000 agents x 8
/// volumes (5 MiB), so an interval's points go out as one range whatever order its reports
/// came in.
const BATCH_POINTS: usize = 1 << 17;

/// Raw bytes of agent reports compressed together as one zstd frame. zstd builds its entropy
/// tables per frame: for one agent's report of 3-10 KB each, that set-up was a third of the
/// writer's time, and the writer a fifth of the coordinator's CPU at 10,000 agents
/// (docs/scale.md#frames). 64 KiB took compression from 3.9 to 2.5 us per volume-interval and
/// stored 3% less; reading one volume back then decompresses up to 64 KiB instead of one
/// report.
const FRAME_BYTES: usize = 64 << 10;

/// How long gathered bytes may wait for more when no report comes: what a crash of the
/// coordinator can lose beyond the queue.
const BATCH_WAIT: Duration = Duration::from_millis(250);

/// How long the writer sleeps when the queue is empty (`Files::next`): what it adds to the
/// end of a run; meanwhile reports wait in the queue (about 100 at 10,000 agents a second).
const IDLE_POLL: Duration = Duration::from_millis(10);

struct Files {
    hist: File,
    hist_len: u64,
    index: File,
    points: File,
    header: PointsHeader,
    compressor: zstd::bulk::Compressor<'static>,
    stats: StoreStats,
    backlog: Arc<Backlog>,
    batch: Batch,
    frame: Frame,
}

/// Agent reports gathered for the next zstd frame: their records one after the other, and
/// their index entries (where the frame goes is filled in when it is sealed).
#[derive(Default)]
struct Frame {
    raw: Vec<u8>,
    entries: Vec<IndexEntry>,
}

/// What is gathered for the next write: compressed blocks and their index entries, in order,
/// and points by their offset in the points file.
#[derive(Default)]
struct Batch {
    hist: Vec<u8>,
    index: Vec<u8>,
    points: Vec<(u64, [u8; POINT_SIZE])>,
    since: Option<Instant>,
}

impl Files {
    fn run(mut self, rx: Receiver<ReportBlock>) -> StoreStats {
        while let Some(block) = self.next(&rx) {
            if self.stats.error.is_none()
                && let Err(e) = self.write(&block)
            {
                self.stats.error = Some(e.to_string());
            }
            let size = block.size();
            self.backlog.recycle(block.records);
            self.backlog.give_back(size);
        }
        self.flush_or_keep_error();
        if self.stats.error.is_none() {
            let synced = self
                .hist
                .sync_data()
                .and_then(|()| self.index.sync_data())
                .and_then(|()| self.points.sync_data());
            if let Err(e) = synced {
                self.stats.error = Some(e.to_string());
            }
        }
        self.stats
    }

    /// The next report, writing what is gathered when it has waited `BATCH_WAIT`; `None` when
    /// the run has ended. An empty queue is looked at again after `IDLE_POLL`, not waited on:
    /// a writer parked in `recv` is woken by every report the run loop sends, a system call
    /// and a switch of threads each, 10,000 of them a second at 10,000 agents.
    fn next(&mut self, rx: &Receiver<ReportBlock>) -> Option<ReportBlock> {
        loop {
            match rx.try_recv() {
                Ok(b) => return Some(b),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {}
            }
            if self.batch.since.is_some_and(|t| t.elapsed() >= BATCH_WAIT) {
                self.flush_or_keep_error();
            }
            std::thread::sleep(IDLE_POLL);
        }
    }

    fn flush_or_keep_error(&mut self) {
        if let Err(e) = self.flush()
            && self.stats.error.is_none()
        {
            self.stats.error = Some(e.to_string());
        }
    }

    /// Writes what is gathered: the histograms before the index entries that point into them
    /// (a reader of a crashed run's files never finds an entry past the data), the points as
    /// runs of adjacent offsets (an interval's reports fill one range of the file).
    fn flush(&mut self) -> io::Result<()> {
        self.batch.since = None;
        self.flush_histograms()?;
        self.flush_points()
    }

    fn flush_histograms(&mut self) -> io::Result<()> {
        self.seal_frame()?;
        let (hist, index) = (&mut self.batch.hist, &mut self.batch.index);
        let written = match self.stats.error {
            Some(_) => Ok(()),
            None => self
                .hist
                .write_all(hist)
                .and_then(|()| self.index.write_all(index)),
        };
        hist.clear();
        index.clear();
        written
    }

    fn flush_points(&mut self) -> io::Result<()> {
        let mut points = std::mem::take(&mut self.batch.points);
        let written = self.write_points(&mut points);
        points.clear();
        self.batch.points = points;
        written
    }

    fn write_points(&mut self, points: &mut [(u64, [u8; POINT_SIZE])]) -> io::Result<()> {
        if self.stats.error.is_some() {
            return Ok(());
        }
        points.sort_unstable_by_key(|&(at, _)| at);
        let mut run: Vec<u8> = Vec::with_capacity(points.len() * POINT_SIZE);
        let mut start = 0;
        for &(at, p) in points.iter() {
            if !run.is_empty() && start + run.len() as u64 != at {
                self.points.write_all_at(&run, start)?;
                run.clear();
            }
            if run.is_empty() {
                start = at;
            }
            run.extend_from_slice(&p);
        }
        if !run.is_empty() {
            self.points.write_all_at(&run, start)?;
        }
        Ok(())
    }

    /// Compresses the gathered reports as one frame and adds it and their index entries to
    /// the batch.
    fn seal_frame(&mut self) -> io::Result<()> {
        if self.frame.entries.is_empty() {
            return Ok(());
        }
        let packed = self.compressor.compress(&self.frame.raw)?;
        let crc = crc32c::crc32c(&packed);
        for e in self.frame.entries.drain(..) {
            let entry = IndexEntry {
                offset: self.hist_len,
                len: packed.len() as u32,
                crc,
                ..e
            };
            self.batch.index.extend_from_slice(&entry.to_bytes());
        }
        self.frame.raw.clear();
        self.batch.hist.extend_from_slice(&packed);
        self.hist_len += packed.len() as u64;
        self.stats.frames += 1;
        self.stats.stored_bytes += packed.len() as u64;
        Ok(())
    }

    /// Adds one report's records to the frame being gathered; a report sharing a volume with
    /// one already there (the same agent's next or late interval) starts a new frame, so a
    /// record's volume names its report.
    fn gather(&mut self, b: &ReportBlock) -> io::Result<()> {
        let entry = IndexEntry {
            interval: b.interval as u32,
            len_ms: b.len_ms,
            first_volume: b.first_volume,
            volumes: b.volumes,
            ..IndexEntry::default()
        };
        if self.frame.entries.iter().any(|e| e.overlaps(&entry)) {
            self.seal_frame()?;
        }
        self.frame.raw.extend_from_slice(&b.records);
        self.frame.entries.push(entry);
        self.stats.blocks += 1;
        self.stats.raw_bytes += b.records.len() as u64;
        if self.frame.raw.len() >= FRAME_BYTES {
            self.seal_frame()?;
        }
        Ok(())
    }

    fn write(&mut self, b: &ReportBlock) -> io::Result<()> {
        if !b.records.is_empty() {
            self.gather(b)?;
        }
        let at = self.header.offset(b.interval, b.first_volume);
        for (k, p) in b.points.chunks_exact(POINT_SIZE).enumerate() {
            let mut point = [0u8; POINT_SIZE];
            point.copy_from_slice(p);
            self.batch
                .points
                .push((at + (k * POINT_SIZE) as u64, point));
        }
        self.batch.since.get_or_insert_with(Instant::now);
        if self.batch.hist.len() >= BATCH_BYTES {
            self.flush_histograms()?;
        }
        if self.batch.points.len() >= BATCH_POINTS {
            self.flush_points()?;
        }
        Ok(())
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
        let stored = stored_blocks(dir.path());
        for (e, records) in &stored {
            let i = e.interval as usize;
            assert_eq!(records.len(), 1);
            assert_eq!(records[0], vec![i as u8; len(i)], "block {i}");
        }
        assert_eq!(stored.len(), blocks);
    }

    /// Each index entry with its report's records' bytes, read as written (the records are not
    /// histograms here, so not through `StoreReader::histograms`, which decodes them).
    fn stored_blocks(run_dir: &Path) -> Vec<(IndexEntry, Vec<Vec<u8>>)> {
        let r = StoreReader::open(run_dir).unwrap();
        let data = std::fs::read(run_dir.join(DATA_DIR).join(HISTOGRAMS)).unwrap();
        r.index()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let packed = &data[e.offset as usize..e.offset as usize + e.len as usize];
                let raw = zstd::bulk::decompress(packed, 1 << 20).unwrap();
                let records: Vec<Record<'_>> = super::super::format::records_of(&raw, &e)
                    .collect::<Result<_, _>>()
                    .unwrap();
                (e, records.iter().map(|r| r.bytes.to_vec()).collect())
            })
            .collect()
    }

    /// Reports come in any order (late agents, intervals overlapping) and are written in
    /// batches: every point lands at its own offset, a missing report leaves its points
    /// unwritten, and a batch waits at most `BATCH_WAIT` for more before it reaches the files.
    #[test]
    fn batched_reports_in_any_order_land_where_they_belong_and_do_not_wait_long() {
        let dir = tempfile::tempdir().unwrap();
        let vols: Vec<StoredVolume> = (0..6)
            .map(|v| StoredVolume {
                node: format!("n{}", v / 2),
                volume: format!("v{v}"),
                role: "r".into(),
            })
            .collect();
        let data = dir.path().join(DATA_DIR);
        let w = StoreWriter::create(&data, &Manifest::new(1000, vols)).unwrap();
        let mark = |interval: u64, volume: u32| (interval * 16 + volume as u64 + 1) as u8;
        let send = |interval: u64, agent: u32| {
            let vi = volume_interval(mark(interval, agent), 40);
            let mut b = w.block(interval, 1000, agent * 2, 2, 2 * records_len(&vi));
            for v in [agent * 2, agent * 2 + 1] {
                b.add(v, &vi);
                b.add_point(v, &[mark(interval, v); POINT_SIZE]);
            }
            w.write(b);
        };
        let header = PointsHeader {
            volumes: 6,
            interval_ms: 1000,
        };
        // Interval 0 from agents 2, 0, 1; interval 1 from agents 1, 0 (agent 2 never sends
        // it); later interval 2 from agents 2, 0.
        for (interval, agent) in [(0, 2), (0, 0), (0, 1), (1, 1), (1, 0)] {
            send(interval, agent);
        }
        // Nothing more comes for a while: the batch reaches the files within BATCH_WAIT.
        std::thread::sleep(BATCH_WAIT * 3);
        let points = std::fs::read(data.join(POINTS)).unwrap();
        assert!(
            points.len() as u64 >= header.offset(1, 4),
            "written while the run goes on: {} bytes",
            points.len()
        );
        let index = std::fs::read(data.join(INDEX)).unwrap();
        assert_eq!(
            index.len(),
            INDEX_MAGIC.len() + 5 * super::super::format::INDEX_ENTRY_SIZE
        );
        send(2, 2);
        send(2, 0);
        let stats = w.finish();
        assert_eq!((stats.error, stats.blocks), (None, 7));
        // Agents 2, 0, 1 of interval 0 share a frame; agent 1's interval 1 starts the next
        // (a frame holds each volume once); interval 2's pair came after the batch was written.
        assert_eq!(stats.frames, 3);
        let points = std::fs::read(data.join(POINTS)).unwrap();
        let at = |interval: u64, volume: u32| {
            let o = header.offset(interval, volume) as usize;
            points.get(o..o + POINT_SIZE).map(|p| p.to_vec())
        };
        for interval in 0..3 {
            for v in 0..6u32 {
                let sent = match interval {
                    0 => true,
                    1 => v < 4,
                    _ => !(2..4).contains(&v),
                };
                let want = sent.then(|| vec![mark(interval, v); POINT_SIZE]);
                let got = at(interval, v).filter(|p| p.iter().any(|&b| b != 0));
                assert_eq!(got, want, "interval {interval} volume {v}");
            }
        }
        // Every index entry points at its own block.
        for (e, records) in stored_blocks(dir.path()) {
            let want = mark(e.interval as u64, e.first_volume / 2);
            assert!(records.iter().all(|r| r.iter().all(|&b| b == want)));
        }
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
