//! The byte layout of a run's data files (docs/scale.md, "Data files"). Pure: bytes in, values
//! out, no IO, so the format is tested directly and a reader in another language needs only
//! this file.
//!
//! - `histograms.lsh`: a 16-byte magic, then frames. A frame is one or more agent reports
//!   (each one agent's interval, all its volumes) one after the other, compressed with zstd as
//!   one frame of at most about `FRAME_BYTES` (writer.rs); inside, records of
//!   `volume u32, tag u8, len u32, bytes`, little-endian. The bytes are the histogram exactly as
//!   the agent sent it (HdrHistogram V2, with or without deflate): the coordinator never
//!   re-encodes, so what is stored is what was measured, and any window or group re-merges
//!   exactly. No two reports in a frame share a volume, so a record's volume says which
//!   report (index entry) it belongs to.
//! - `histograms.idx`: a 16-byte magic, then one 32-byte [`IndexEntry`] per agent report, in
//!   the order written: which interval, which volumes, the frame it is in, and the frame's
//!   checksum. It is 1/40 or less of the data, so a window or a volume is found by scanning it,
//!   never the data.
//! - `points.bin`: a 32-byte header, then one row per interval of one 64-byte [`PointRecord`]
//!   per volume, at a fixed place (`row x volumes + volume`): late intervals are written where
//!   they belong, a missing one reads as absent, and one volume's series is a strided read.
//!
//! Format 1 (index magic `lockstep-idx  1`) had one report per frame: it is format 2 with
//! frames of one report, and is read the same way. Compressing each report alone cost zstd its
//! per-frame set-up (entropy tables) for 3-10 KB each, a fifth of the coordinator's CPU at
//! 10,000 agents (docs/scale.md#frames).

use crate::results::timeline::VolumePoint;

pub const HISTOGRAMS_MAGIC: &[u8; 16] = b"lockstep-hist 1\n";
pub const INDEX_MAGIC: &[u8; 16] = b"lockstep-idx  2\n";
/// The index of format 1 (one report per frame), still read.
pub const INDEX_MAGIC_1: &[u8; 16] = b"lockstep-idx  1\n";
pub const POINTS_MAGIC: &[u8; 16] = b"lockstep-pts  1\n";
pub const POINTS_HEADER: u64 = 32;
pub const POINT_SIZE: usize = 64;
pub const INDEX_ENTRY_SIZE: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("record at byte {at} of a block is cut short")]
    Truncated { at: usize },
    #[error("not a lockstep {what} file (bad magic)")]
    Magic { what: &'static str },
}

/// Which histogram of a volume's interval a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// 0 read, 1 write.
    pub dir: u8,
    /// 0: latency from the actual issue; 1: from the intended issue (open loop).
    pub intended: bool,
}

impl Tag {
    pub fn to_byte(self) -> u8 {
        self.dir | (u8::from(self.intended) << 1)
    }
    pub fn from_byte(b: u8) -> Self {
        Tag {
            dir: b & 1,
            intended: b & 2 != 0,
        }
    }
    /// The hlog tag's tail: `read/lat`, `write/lat_intended`, ...
    pub fn name(self) -> &'static str {
        match (self.dir, self.intended) {
            (0, false) => "read/lat",
            (0, true) => "read/lat_intended",
            (_, false) => "write/lat",
            (_, true) => "write/lat_intended",
        }
    }
}

/// A record's bytes before its histogram: volume (4), tag (1), length (4).
pub const RECORD_HEADER: usize = 9;

/// Appends one histogram record to an uncompressed block.
pub fn push_record(block: &mut Vec<u8>, volume: u32, tag: Tag, bytes: &[u8]) {
    block.extend_from_slice(&volume.to_le_bytes());
    block.push(tag.to_byte());
    block.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    block.extend_from_slice(bytes);
}

/// One record of a decompressed block.
#[derive(Debug, PartialEq)]
pub struct Record<'a> {
    pub volume: u32,
    pub tag: Tag,
    pub bytes: &'a [u8],
}

/// The records of a decompressed block, in order; stops at the first malformed one.
pub fn records(block: &[u8]) -> impl Iterator<Item = Result<Record<'_>, FormatError>> {
    let mut at = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= block.len() {
            return None;
        }
        let head = block.get(at..at + 9);
        let Some(head) = head else {
            failed = true;
            return Some(Err(FormatError::Truncated { at }));
        };
        let volume = u32::from_le_bytes(head[0..4].try_into().unwrap());
        let tag = Tag::from_byte(head[4]);
        let len = u32::from_le_bytes(head[5..9].try_into().unwrap()) as usize;
        let Some(bytes) = block.get(at + 9..at + 9 + len) else {
            failed = true;
            return Some(Err(FormatError::Truncated { at }));
        };
        at += 9 + len;
        Some(Ok(Record { volume, tag, bytes }))
    })
}

/// Where one agent report is and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexEntry {
    /// Interval index since the synchronized start.
    pub interval: u32,
    /// The interval's length (the last one may be short).
    pub len_ms: u32,
    /// The report's volumes are `first_volume .. first_volume + volumes` (an agent's volumes
    /// are consecutive in the run's volume table).
    pub first_volume: u32,
    pub volumes: u32,
    /// Byte offset in `histograms.lsh` of the compressed frame holding the report, and the
    /// frame's length (the same for every report in the frame).
    pub offset: u64,
    pub len: u32,
    /// crc32c of the compressed frame: a torn or damaged file is named, not misread.
    pub crc: u32,
}

impl IndexEntry {
    pub fn to_bytes(&self) -> [u8; INDEX_ENTRY_SIZE] {
        let mut b = [0u8; INDEX_ENTRY_SIZE];
        b[0..4].copy_from_slice(&self.interval.to_le_bytes());
        b[4..8].copy_from_slice(&self.len_ms.to_le_bytes());
        b[8..12].copy_from_slice(&self.first_volume.to_le_bytes());
        b[12..16].copy_from_slice(&self.volumes.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; INDEX_ENTRY_SIZE]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        IndexEntry {
            interval: u32_at(0),
            len_ms: u32_at(4),
            first_volume: u32_at(8),
            volumes: u32_at(12),
            offset: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            len: u32_at(24),
            crc: u32_at(28),
        }
    }

    pub fn holds(&self, volume: u32) -> bool {
        (self.first_volume..self.first_volume + self.volumes).contains(&volume)
    }

    /// Whether this report and `other` share a volume (then they may not share a frame).
    pub fn overlaps(&self, other: &IndexEntry) -> bool {
        self.first_volume < other.first_volume + other.volumes
            && other.first_volume < self.first_volume + self.volumes
    }
}

/// The records of report `entry` in its decompressed frame: those of its volumes.
pub fn records_of<'a>(
    frame: &'a [u8],
    entry: &'a IndexEntry,
) -> impl Iterator<Item = Result<Record<'a>, FormatError>> + 'a {
    records(frame).filter(move |r| r.as_ref().map_or(true, |r| entry.holds(r.volume)))
}

/// The header of `points.bin`: the table's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointsHeader {
    pub volumes: u32,
    pub interval_ms: u32,
}

impl PointsHeader {
    pub fn to_bytes(&self) -> [u8; POINTS_HEADER as usize] {
        let mut b = [0u8; POINTS_HEADER as usize];
        b[0..16].copy_from_slice(POINTS_MAGIC);
        b[16..20].copy_from_slice(&self.volumes.to_le_bytes());
        b[20..24].copy_from_slice(&self.interval_ms.to_le_bytes());
        b[24..28].copy_from_slice(&(POINT_SIZE as u32).to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < POINTS_HEADER as usize || &b[0..16] != POINTS_MAGIC {
            return Err(FormatError::Magic { what: "points" });
        }
        Ok(PointsHeader {
            volumes: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            interval_ms: u32::from_le_bytes(b[20..24].try_into().unwrap()),
        })
    }

    /// Byte offset of (interval, volume).
    pub fn offset(&self, interval: u64, volume: u32) -> u64 {
        POINTS_HEADER + (interval * self.volumes as u64 + volume as u64) * POINT_SIZE as u64
    }
}

const PRESENT: u8 = 1;
const MEASURED: u8 = 2;

/// One volume's interval point as stored: counts exact, latencies as f32 microseconds (the
/// point's percentiles are for plotting and the finder; exact figures come from re-merging the
/// histograms). Counts per interval fit u32 up to 4 billion IOs a second.
pub fn encode_point(p: &VolumePoint, measured: bool) -> [u8; POINT_SIZE] {
    let mut b = [0u8; POINT_SIZE];
    b[0] = PRESENT | if measured { MEASURED } else { 0 };
    b[4..8].copy_from_slice(&(p.len_ms.min(u32::MAX as u64) as u32).to_le_bytes());
    let mut at = 8;
    let mut put = |bytes: &[u8]| {
        b[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    for d in 0..2 {
        put(&(p.ios[d].min(u32::MAX as u64) as u32).to_le_bytes());
    }
    for d in 0..2 {
        put(&(p.errors[d].min(u32::MAX as u64) as u32).to_le_bytes());
    }
    for d in 0..2 {
        put(&p.bytes[d].to_le_bytes());
    }
    for x in [
        p.outstanding,
        p.lat_mean_us,
        p.lat_p50_us,
        p.lat_p99_us,
        p.lat_max_us,
    ] {
        put(&(x as f32).to_le_bytes());
    }
    b
}

/// A stored point back, or `None` where the volume did not report that interval.
pub fn decode_point(b: &[u8], interval: u64, interval_ms: u64) -> Option<(VolumePoint, bool)> {
    if b.len() < POINT_SIZE || b[0] & PRESENT == 0 {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as u64;
    let f32_at = |i: usize| f32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as f64;
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let p = VolumePoint {
        t_ms: (interval + 1) * interval_ms,
        len_ms: u32_at(4),
        ios: [u32_at(8), u32_at(12)],
        errors: [u32_at(16), u32_at(20)],
        bytes: [u64_at(24), u64_at(32)],
        outstanding: f32_at(40),
        lat_mean_us: f32_at(44),
        lat_p50_us: f32_at(48),
        lat_p99_us: f32_at(52),
        lat_max_us: f32_at(56),
    };
    Some((p, b[0] & MEASURED != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(recs in proptest::collection::vec(
            (any::<u32>(), 0u8..4, proptest::collection::vec(any::<u8>(), 0..64)), 0..20)) {
            let mut block = Vec::new();
            for (v, t, bytes) in &recs {
                push_record(&mut block, *v, Tag::from_byte(*t), bytes);
            }
            let back: Vec<_> = records(&block).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(back.len(), recs.len());
            for (r, (v, t, bytes)) in back.iter().zip(&recs) {
                prop_assert_eq!(r.volume, *v);
                prop_assert_eq!(r.tag.to_byte(), *t);
                prop_assert_eq!(r.bytes, &bytes[..]);
            }
            // Any cut inside the last record is reported, never misread.
            if let Some(last) = recs.last() {
                let cut = block.len() - 1 - last.2.len().min(3);
                let r: Result<Vec<_>, _> = records(&block[..cut]).collect();
                prop_assert!(r.is_err());
            }
        }

        #[test]
        fn index_entries_round_trip(i in any::<u32>(), l in any::<u32>(), f in any::<u32>(),
                                    n in any::<u32>(), o in any::<u64>(), len in any::<u32>(),
                                    crc in any::<u32>()) {
            let e = IndexEntry { interval: i, len_ms: l, first_volume: f, volumes: n, offset: o, len, crc };
            prop_assert_eq!(IndexEntry::from_bytes(&e.to_bytes()), e);
        }

        #[test]
        fn points_keep_counts_exact(ios in any::<[u32; 2]>(), bytes in any::<[u64; 2]>(),
                                    errors in any::<[u32; 2]>(), lat in 0.0f64..1e7, idx in 0u64..100_000) {
            let p = VolumePoint {
                t_ms: (idx + 1) * 500, len_ms: 500,
                ios: [ios[0] as u64, ios[1] as u64], bytes,
                errors: [errors[0] as u64, errors[1] as u64],
                outstanding: 3.5, lat_mean_us: lat, lat_p50_us: lat, lat_p99_us: lat * 2.0, lat_max_us: lat * 3.0,
            };
            let (q, measured) = decode_point(&encode_point(&p, true), idx, 500).unwrap();
            prop_assert!(measured);
            prop_assert_eq!((q.t_ms, q.len_ms, q.ios, q.bytes, q.errors), (p.t_ms, p.len_ms, p.ios, p.bytes, p.errors));
            prop_assert!((q.lat_p99_us - p.lat_p99_us).abs() <= p.lat_p99_us * 1e-6 + 1e-9);
        }
    }

    #[test]
    fn an_unwritten_point_is_absent() {
        assert!(decode_point(&[0u8; POINT_SIZE], 3, 1000).is_none());
        let h = PointsHeader {
            volumes: 8,
            interval_ms: 1000,
        };
        assert_eq!(PointsHeader::from_bytes(&h.to_bytes()).unwrap(), h);
        assert_eq!(h.offset(2, 3), 32 + (2 * 8 + 3) * 64);
        assert!(PointsHeader::from_bytes(b"nope").is_err());
    }
}
