//! Reads a run's data files back: any window of intervals for any set of volumes, streamed
//! block by block, so re-merging a group or a window never loads the run.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use lockstep_proto::histogram::SparseHistogram;

use super::format::{
    self, FormatError, INDEX_ENTRY_SIZE, INDEX_MAGIC, INDEX_MAGIC_1, IndexEntry, POINT_SIZE,
    PointsHeader, Tag,
};
use super::{DATA_DIR, HISTOGRAMS, INDEX, MANIFEST, Manifest, POINTS};
use crate::results::hlog::LogEntry;
use crate::results::keeper::{Keep, KeptPoints};
use crate::results::timeline::{Timeline, VolumePoint};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: {message}")]
    Corrupt { path: String, message: String },
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// One histogram of the store.
#[derive(Debug, Clone)]
pub struct StoredHistogram {
    pub interval: u64,
    pub len_ms: u64,
    pub volume: u32,
    pub tag: Tag,
    pub histogram: SparseHistogram,
    /// The bytes as the agent sent them.
    pub raw: Vec<u8>,
}

pub struct StoreReader {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl StoreReader {
    /// Opens the `data/` directory of the results directory `run_dir`.
    pub fn open(run_dir: &Path) -> Result<Self, StoreError> {
        let dir = run_dir.join(DATA_DIR);
        let path = dir.join(MANIFEST);
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        let manifest = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            path: path.display().to_string(),
            message: format!("not a lockstep data manifest: {e}"),
        })?;
        Ok(StoreReader { dir, manifest })
    }

    /// Whether `run_dir` has data files (runs of lockstep before 0.2 have intervals.hlog).
    pub fn exists(run_dir: &Path) -> bool {
        run_dir.join(DATA_DIR).join(MANIFEST).is_file()
    }

    /// Every index entry, in the order written (the index is small: 32 bytes per agent and
    /// interval). Consecutive entries may point at the same frame.
    pub fn index(
        &self,
    ) -> Result<impl Iterator<Item = Result<IndexEntry, StoreError>>, StoreError> {
        let path = self.dir.join(INDEX);
        let f = File::open(&path).map_err(io_err(&path))?;
        let mut r = BufReader::with_capacity(1 << 16, f);
        let mut magic = [0u8; 16];
        r.read_exact(&mut magic).map_err(io_err(&path))?;
        if &magic != INDEX_MAGIC && &magic != INDEX_MAGIC_1 {
            return Err(corrupt(&path, FormatError::Magic { what: "index" }));
        }
        Ok(std::iter::from_fn(move || {
            let mut b = [0u8; INDEX_ENTRY_SIZE];
            match r.read_exact(&mut b) {
                Ok(()) => Some(Ok(IndexEntry::from_bytes(&b))),
                // A torn last entry (the run was killed mid-write) ends the index.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
                Err(e) => Some(Err(io_err(&path)(e))),
            }
        }))
    }

    /// The histograms of intervals `intervals` for the volumes `want` selects, block by block.
    pub fn histograms<'a>(
        &'a self,
        intervals: std::ops::Range<u64>,
        want: impl Fn(u32) -> bool + 'a,
    ) -> Result<impl Iterator<Item = Result<StoredHistogram, StoreError>> + 'a, StoreError> {
        let path = self.dir.join(HISTOGRAMS);
        let data = File::open(&path).map_err(io_err(&path))?;
        let mut decompressor = zstd::bulk::Decompressor::new().map_err(io_err(&path))?;
        let want = std::rc::Rc::new(want);
        let block_wanted = want.clone();
        let mut blocks = self.index()?.filter(move |e| match e {
            Ok(e) => {
                intervals.contains(&(e.interval as u64))
                    && (e.first_volume..e.first_volume + e.volumes).any(|v| block_wanted(v))
            }
            Err(_) => true,
        });
        let mut pending = Vec::new().into_iter();
        let mut frame = Frame::default();
        Ok(std::iter::from_fn(move || {
            loop {
                if let Some(h) = pending.next() {
                    return Some(h);
                }
                let e = match blocks.next()? {
                    Ok(e) => e,
                    Err(err) => return Some(Err(err)),
                };
                pending = match read_block(&data, &path, &e, &mut decompressor, &mut frame) {
                    Ok(hs) => hs
                        .into_iter()
                        .filter(|h| want(h.volume))
                        .map(Ok)
                        .collect::<Vec<_>>()
                        .into_iter(),
                    Err(err) => vec![Err(err)].into_iter(),
                };
            }
        }))
    }

    /// The histograms as hlog entries (`node/volume/read|write/lat|lat_intended`), for the
    /// analyses that take the raw histograms of a whole run (drills, compare, curves).
    pub fn entries<'a>(
        &'a self,
        want: impl Fn(u32) -> bool + 'a,
    ) -> Result<impl Iterator<Item = Result<LogEntry, StoreError>> + 'a, StoreError> {
        let interval_ms = self.manifest.interval_ms;
        let it = self.histograms(0..u64::MAX, want)?;
        Ok(it.map(move |h| {
            let h = h?;
            let v = &self.manifest.volumes[h.volume as usize];
            Ok(LogEntry {
                tag: format!("{}/{}/{}", v.node, v.volume, h.tag.name()),
                start_s: (h.interval * interval_ms) as f64 / 1000.0,
                len_s: h.len_ms as f64 / 1000.0,
                histogram: h.histogram,
            })
        }))
    }

    /// `points.bin` opened, its header read, and how many whole rows (intervals) it holds.
    fn open_points(&self) -> Result<(PathBuf, File, PointsHeader, u64), StoreError> {
        let path = self.dir.join(POINTS);
        let f = File::open(&path).map_err(io_err(&path))?;
        let mut head = [0u8; format::POINTS_HEADER as usize];
        f.read_exact_at(&mut head, 0).map_err(io_err(&path))?;
        let header = PointsHeader::from_bytes(&head).map_err(|e| corrupt(&path, e))?;
        let len = f.metadata().map_err(io_err(&path))?.len();
        let row_len = header.volumes as u64 * POINT_SIZE as u64;
        let rows = len.saturating_sub(format::POINTS_HEADER) / row_len.max(1);
        Ok((path, f, header, rows))
    }

    /// The points of every volume, one interval (row) at a time: `(interval, [(volume, point,
    /// measured)])`. Reads the file sequentially.
    pub fn point_rows(
        &self,
    ) -> Result<
        impl Iterator<Item = Result<(u64, Vec<(u32, VolumePoint, bool)>), StoreError>>,
        StoreError,
    > {
        let (path, mut f, header, _) = self.open_points()?;
        f.seek(io::SeekFrom::Start(format::POINTS_HEADER))
            .map_err(io_err(&path))?;
        let mut r = BufReader::with_capacity(1 << 20, f);
        let row_len = header.volumes as usize * POINT_SIZE;
        let mut row = vec![0u8; row_len];
        let mut interval = 0u64;
        Ok(std::iter::from_fn(move || {
            if row_len == 0 {
                return None;
            }
            match r.read_exact(&mut row) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return None,
                Err(e) => return Some(Err(io_err(&path)(e))),
            }
            let points = row
                .chunks_exact(POINT_SIZE)
                .enumerate()
                .filter_map(|(v, b)| {
                    format::decode_point(b, interval, header.interval_ms as u64)
                        .map(|(p, m)| (v as u32, p, m))
                })
                .collect();
            interval += 1;
            Some(Ok((interval - 1, points)))
        }))
    }
}

impl StoreReader {
    /// The run's timeline read back from `points.bin`, one point per `keep.fold` intervals
    /// (folded exactly as the merger folds them), onto the volumes of `meta` (the merger's
    /// series, in the same order, whose points are empty). Memory: the folded points only.
    pub fn timeline(&self, keep: &Keep, meta: Timeline) -> Result<Timeline, StoreError> {
        let keep = Keep {
            in_memory: true,
            recent: 0,
            ..*keep
        };
        // Room for exactly the folded points (a doubling Vec would hold up to twice them).
        let (_, _, _, rows) = self.open_points()?;
        let slots = rows.div_ceil(keep.fold.max(1)) as usize + 1;
        let mut kept: Vec<KeptPoints> = (0..meta.volumes.len())
            .map(|_| KeptPoints::with_room(slots))
            .collect();
        for row in self.point_rows()? {
            let (interval, points) = row?;
            for (v, p, _) in points {
                if let Some(k) = kept.get_mut(v as usize) {
                    k.push(interval, p, &keep);
                }
            }
        }
        let mut t = meta;
        t.interval_ms = keep.interval_ms * keep.fold;
        // Moved, not copied: a copy of 4 million points held both at once for a moment,
        // which was the run's peak memory (docs/scale.md).
        for (s, k) in t.volumes.iter_mut().zip(kept) {
            s.points = k.into_all(&keep);
        }
        Ok(t)
    }
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The frame last decompressed: the reports of one frame have consecutive index entries, so
/// reading them one after the other decompresses it once.
#[derive(Default)]
struct Frame {
    offset: Option<u64>,
    raw: Vec<u8>,
}

fn read_frame<'f>(
    data: &File,
    path: &Path,
    e: &IndexEntry,
    decompressor: &mut zstd::bulk::Decompressor<'static>,
    frame: &'f mut Frame,
) -> Result<&'f [u8], StoreError> {
    if frame.offset == Some(e.offset) {
        return Ok(&frame.raw);
    }
    frame.offset = None;
    let mut packed = vec![0u8; e.len as usize];
    data.read_exact_at(&mut packed, e.offset)
        .map_err(io_err(path))?;
    if crc32c::crc32c(&packed) != e.crc {
        return Err(corrupt(
            path,
            format!(
                "frame of interval {} at byte {} fails its checksum",
                e.interval, e.offset
            ),
        ));
    }
    // A frame is one agent's report or several up to 64 KiB: its size is bounded by what one
    // message may carry.
    frame.raw = decompressor
        .decompress(&packed, 64 << 20)
        .map_err(|err| corrupt(path, format!("frame at byte {}: {err}", e.offset)))?;
    frame.offset = Some(e.offset);
    Ok(&frame.raw)
}

fn read_block(
    data: &File,
    path: &Path,
    e: &IndexEntry,
    decompressor: &mut zstd::bulk::Decompressor<'static>,
    frame: &mut Frame,
) -> Result<Vec<StoredHistogram>, StoreError> {
    let raw = read_frame(data, path, e, decompressor, frame)?;
    let mut out = Vec::new();
    for r in format::records_of(raw, e) {
        let r = r.map_err(|err| corrupt(path, format!("frame at byte {}: {err}", e.offset)))?;
        let histogram = SparseHistogram::decode(r.bytes).map_err(|err| {
            corrupt(
                path,
                format!("volume {} interval {}: {err}", r.volume, e.interval),
            )
        })?;
        out.push(StoredHistogram {
            interval: e.interval as u64,
            len_ms: e.len_ms as u64,
            volume: r.volume,
            tag: r.tag,
            histogram,
            raw: r.bytes.to_vec(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::writer::ReportBlock;
    use super::super::{Manifest, StoreWriter, StoredVolume};
    use super::*;
    use crate::results::store::format::encode_point;
    use hdrhistogram::Histogram;
    use lockstep_proto::histogram::encode;
    use lockstep_proto::v1::{DirInterval, VolumeInterval};

    fn vi(values: &[u64]) -> VolumeInterval {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for &v in values {
            h.record(v).unwrap();
        }
        VolumeInterval {
            volume: String::new(),
            read: Some(DirInterval {
                ios: values.len() as u64,
                lat_hist: encode(&h).unwrap(),
                ..Default::default()
            }),
            write: None,
            ..Default::default()
        }
    }

    #[test]
    fn windows_and_volumes_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let vols = (0..4)
            .map(|i| StoredVolume {
                node: format!("n{}", i / 2),
                volume: format!("v{}", i % 2),
                role: "r".into(),
            })
            .collect();
        let m = Manifest::new(1000, vols);
        let w = StoreWriter::create(&dir.path().join(DATA_DIR), &m).unwrap();
        // Two agents of two volumes, 5 intervals, the second agent's interval 2 arrives late.
        let mut order: Vec<(u64, u32)> = (0..5u64)
            .flat_map(|i| [(i, 0u32), (i, 2)])
            .filter(|&(i, a)| !(i == 2 && a == 2))
            .collect();
        order.push((2, 2));
        for (i, first) in order {
            let mut b = ReportBlock::new(i, 1000, first, 2);
            for v in first..first + 2 {
                let lat = 1000 * (v as u64 + 1) + i;
                let p = VolumePoint {
                    t_ms: (i + 1) * 1000,
                    len_ms: 1000,
                    ios: [1, 0],
                    lat_p99_us: lat as f64 / 1000.0,
                    ..Default::default()
                };
                b.add(v, &vi(&[lat]));
                b.add_point(v, &encode_point(&p, true));
            }
            w.write(b);
        }
        let stats = w.finish();
        assert_eq!(stats.error, None);
        assert_eq!(stats.blocks, 10);
        // Each frame holds what came until a report shared a volume with it: [0:0, 0:2],
        // [1:0, 1:2], [2:0], [3:0, 3:2], [4:0, 4:2], [2:2 late]. Read back, every record
        // belongs to its own report once.
        assert_eq!(stats.frames, 6);
        let r = StoreReader::open(dir.path()).unwrap();
        let got: Vec<_> = r
            .histograms(1..3, |v| v == 3)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut lat: Vec<(u64, u64)> = got
            .iter()
            .map(|h| (h.interval, h.histogram.max() / 10))
            .collect();
        lat.sort();
        // HdrHistogram's 3 digits: 4,001 ns and 4,002 ns are in buckets 2 ns wide.
        assert_eq!(lat, vec![(1, 400), (2, 400)]);
        let rows: Vec<_> = r.point_rows().unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[2].1.len(), 4, "the late report landed in its row");
        assert!((rows[2].1[3].1.lat_p99_us - 4.002).abs() < 1e-6);
        let e: Vec<_> = r
            .entries(|_| true)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(e.len(), 20);
        assert!(
            e.iter()
                .any(|e| e.tag == "n1/v1/read/lat" && e.start_s == 4.0)
        );
    }

    /// A data writer for a run of one volume in `run_dir`.
    fn one_volume_writer(run_dir: &Path) -> StoreWriter {
        let m = Manifest::new(
            1000,
            vec![StoredVolume {
                node: "n".into(),
                volume: "v".into(),
                role: "r".into(),
            }],
        );
        StoreWriter::create(&run_dir.join(DATA_DIR), &m).unwrap()
    }

    /// A run written before frames held several reports (index magic 1) reads the same.
    #[test]
    fn an_index_of_format_1_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let w = one_volume_writer(dir.path());
        for i in 0..3u64 {
            let mut b = ReportBlock::new(i, 1000, 0, 1);
            b.add(0, &vi(&[5000 + i * 1000]));
            w.write(b);
        }
        assert_eq!(w.finish().frames, 3);
        let path = dir.path().join(DATA_DIR).join(INDEX);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..16].copy_from_slice(INDEX_MAGIC_1);
        std::fs::write(&path, bytes).unwrap();
        let r = StoreReader::open(dir.path()).unwrap();
        let max: Vec<u64> = r
            .histograms(0..10, |_| true)
            .unwrap()
            .map(|h| h.unwrap().histogram.max() / 1000)
            .collect();
        assert_eq!(max, vec![5, 6, 7]);
        bytes = std::fs::read(&path).unwrap();
        bytes[..16].copy_from_slice(b"lockstep-idx  9\n");
        std::fs::write(&path, bytes).unwrap();
        assert!(
            r.histograms(0..10, |_| true).is_err(),
            "an unknown format is refused"
        );
    }

    #[test]
    fn a_damaged_block_is_named_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let w = one_volume_writer(dir.path());
        let mut b = ReportBlock::new(0, 1000, 0, 1);
        b.add(0, &vi(&[5000; 10]));
        w.write(b);
        w.finish();
        let path = dir.path().join(DATA_DIR).join(HISTOGRAMS);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let r = StoreReader::open(dir.path()).unwrap();
        let e = r
            .histograms(0..10, |_| true)
            .unwrap()
            .find_map(|h| h.err())
            .unwrap()
            .to_string();
        assert!(
            e.contains("histograms.lsh") && e.contains("checksum"),
            "{e}"
        );
    }
}
