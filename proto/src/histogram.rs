//! Latency histograms on the wire: HdrHistogram V2, framed so standard tools read it.
//!
//! Agents encode their dense histograms with the hdrhistogram crate. The coordinator decodes
//! them into `SparseHistogram`s instead of dense ones: a dense histogram of lockstep's range
//! (1 ns to 1 h, 3 significant digits) is 33,000 counters (264 KiB), and a 1,000-agent x
//! 8-volume cluster would need gigabytes and a full scan per merge. A volume's latencies occupy
//! a few hundred to a few thousand buckets, so the sparse form merges in time proportional to
//! the buckets in use. It keeps the exact buckets of the dense form, so every percentile equals
//! the one HdrHistogram computes on the same data (tested below): merging stays exact.
//!
//! The wire format ([`WIRE`]) was chosen by measurement (docs/scale.md, "Merge path"): inflating
//! cost the coordinator more CPU per volume-interval than its whole budget at 10,000 agents,
//! while the bytes it saved are cheap on a LAN. Agents send V2 inside a zlib stream of *stored*
//! (uncompressed) deflate blocks: the V2 compressed cookie, so HdrHistogram log readers of every
//! language (which insist on it in `.hlog` files) still read the raw bytes the coordinator logs,
//! while the coordinator takes the payload out of the blocks without inflating. Decoding
//! accepts every framing ([`Wire`]): old agents and old `.hlog` files use real deflate.

use hdrhistogram::Histogram;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer, V2Serializer};

#[derive(Debug, thiserror::Error)]
pub enum HistogramCodecError {
    #[error("could not encode a latency histogram: {0}")]
    Encode(String),
    #[error(
        "could not decode a latency histogram from the wire (corrupt or from another version): {0}"
    )]
    Decode(String),
}

/// How a histogram is framed on the wire; every framing decodes everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// V2 deflated at zlib's default level (the format before 2026-11-25): the fewest bytes,
    /// and an inflate on the coordinator for every histogram.
    Deflate,
    /// V2 in a zlib stream of stored blocks, with the compressed cookie: 19 bytes more than
    /// `Plain`, readable where only compressed histograms are accepted (hlog lines).
    Stored,
    /// V2 uncompressed (cookie 0x1c849303).
    Plain,
}

/// What agents send.
pub const WIRE: Wire = Wire::Stored;

impl std::str::FromStr for Wire {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "deflate" => Ok(Wire::Deflate),
            "stored" => Ok(Wire::Stored),
            "plain" => Ok(Wire::Plain),
            _ => Err(format!(
                "unknown wire format '{s}' (deflate, stored, plain)"
            )),
        }
    }
}

pub fn encode(h: &Histogram<u64>) -> Result<Vec<u8>, HistogramCodecError> {
    encode_as(h, WIRE)
}

pub fn encode_as(h: &Histogram<u64>, wire: Wire) -> Result<Vec<u8>, HistogramCodecError> {
    let fail = |e: &dyn std::fmt::Debug| HistogramCodecError::Encode(format!("{e:?}"));
    let mut out = Vec::new();
    match wire {
        Wire::Deflate => {
            V2DeflateSerializer::new()
                .serialize(h, &mut out)
                .map_err(|e| fail(&e))?;
        }
        Wire::Plain => {
            V2Serializer::new()
                .serialize(h, &mut out)
                .map_err(|e| fail(&e))?;
        }
        Wire::Stored => {
            let mut v2 = Vec::new();
            V2Serializer::new()
                .serialize(h, &mut v2)
                .map_err(|e| fail(&e))?;
            out = stored_zlib(&v2);
        }
    }
    Ok(out)
}

/// The significant digits agents record at (fio parity, per-job figures, final results).
pub const RECORDED_DIGITS: u8 = 3;

/// The significant digits a plan may ask interval histograms to be sent at, default first.
/// 3 keeps them as recorded (0.1% value resolution); 2 (1%, fio's own histogram buckets are
/// 1.6% wide) holds about a tenth of the buckets, which makes the coordinator's merge and the
/// data files several times cheaper (docs/scale.md, "Two significant digits").
pub const INTERVAL_DIGITS: [u8; 2] = [3, 2];

/// The interval digits a Prepare asks for: 0 (a coordinator that predates the option) is 3,
/// 2 and 3 are themselves, anything else is refused with a message naming the field.
pub fn interval_digits(asked: u32) -> Result<u8, String> {
    match asked {
        0 => Ok(RECORDED_DIGITS),
        2 | 3 => Ok(asked as u8),
        _ => Err(format!(
            "histogram_digits = {asked} is not supported: 2 or 3 (significant digits of the \
             interval histograms)"
        )),
    }
}

/// The coordinator's check of a Prepare reply: the agent must send the digits asked for.
/// `echoed` 0 is an agent that predates the option, which sends 3.
pub fn check_echoed_digits(asked: u8, echoed: u32) -> Result<(), String> {
    let sends = if echoed == 0 {
        u32::from(RECORDED_DIGITS)
    } else {
        echoed
    };
    if sends == u32::from(asked) {
        return Ok(());
    }
    let who = if echoed == 0 {
        "it did not confirm histogram_digits (an agent older than the option), so it sends 3"
            .to_string()
    } else {
        format!("it would send histogram_digits = {echoed}")
    };
    Err(format!(
        "the plan asks for histogram_digits = {asked} but {who}: histograms of two precisions \
         cannot be merged; run the same lockstep release on coordinator and agents, or use \
         histogram_digits = 3"
    ))
}

/// `h` at `digits` significant digits, exactly: HdrHistogram's buckets at fewer digits are
/// unions of the buckets at more (both are powers of two wide and aligned to their width, and
/// within one power of two the coarser width is a multiple of the finer one), so each count
/// moves whole into the one coarser bucket that contains its bucket. Counts, the total and
/// every value's bucket are preserved; only the resolution drops. `digits` equal to `h`'s
/// is a copy; more digits than `h` has cannot be made up and is an error.
pub fn coarsen(h: &Histogram<u64>, digits: u8) -> Result<Histogram<u64>, HistogramCodecError> {
    let fail = |m: String| HistogramCodecError::Encode(m);
    if digits == h.sigfig() {
        return Ok(h.clone());
    }
    if digits > h.sigfig() {
        return Err(fail(format!(
            "cannot make a {}-digit histogram {digits}-digit",
            h.sigfig()
        )));
    }
    let mut out = Histogram::<u64>::new_with_bounds(h.low(), h.high(), digits)
        .map_err(|e| fail(format!("{e:?}")))?;
    for v in h.iter_recorded() {
        // The bucket's highest value lies in the coarser bucket holding the whole bucket.
        out.record_n(v.value_iterated_to(), v.count_at_value())
            .map_err(|e| fail(format!("{e:?}")))?;
    }
    Ok(out)
}

/// An interval histogram as sent: coarsened to `digits`, then encoded.
pub fn encode_at(h: &Histogram<u64>, digits: u8) -> Result<Vec<u8>, HistogramCodecError> {
    if digits == h.sigfig() {
        return encode(h);
    }
    encode(&coarsen(h, digits)?)
}

/// `v2` in the compressed framing: cookie, length, then a zlib stream (RFC 1950) of stored
/// deflate blocks (RFC 1951, 3.2.4), which any inflater reads back as they are.
fn stored_zlib(v2: &[u8]) -> Vec<u8> {
    let blocks = v2.len().div_ceil(STORED_MAX).max(1);
    let zlib_len = 2 + blocks * 5 + v2.len() + 4;
    let mut out = Vec::with_capacity(8 + zlib_len);
    out.extend_from_slice(&V2_COMPRESSED_COOKIE.to_be_bytes());
    out.extend_from_slice(&(zlib_len as u32).to_be_bytes());
    // CMF 0x78: deflate with a 32 KiB window; FLG 0x01: fastest level, no dictionary, check bits.
    out.extend_from_slice(&[0x78, 0x01]);
    let mut chunks = v2.chunks(STORED_MAX).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let len = chunk.len() as u16;
        out.push(u8::from(last));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&adler32(v2).to_be_bytes());
    out
}

fn adler32(b: &[u8]) -> u32 {
    let mut a = simd_adler32::Adler32::new();
    a.write(b);
    a.finish()
}

/// A stored deflate block holds at most this many bytes.
const STORED_MAX: usize = 65_535;

/// Decodes; an empty byte string is an empty histogram (directions with no IO send nothing).
pub fn decode(bytes: &[u8]) -> Result<Option<Histogram<u64>>, HistogramCodecError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    Deserializer::new()
        .deserialize(&mut &bytes[..])
        .map(Some)
        .map_err(|e| HistogramCodecError::Decode(format!("{e:?}")))
}

/// HdrHistogram's bucket geometry, derived from (lowest discernible value, significant digits)
/// exactly as the hdrhistogram crate derives it, so indexes mean the same values on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub low: u64,
    pub high: u64,
    pub sigfig: u8,
    unit_magnitude: u32,
    sub_bucket_half_count_magnitude: u32,
    sub_bucket_half_count: u32,
    /// The index of `high`: no count of a valid encoding lies beyond it.
    max_index: u32,
}

impl Geometry {
    pub fn new(low: u64, high: u64, sigfig: u8) -> Result<Self, HistogramCodecError> {
        if low < 1 || sigfig > 5 || high < 2 * low {
            return Err(HistogramCodecError::Decode(format!(
                "invalid histogram parameters low={low} high={high} sigfig={sigfig}"
            )));
        }
        let unit_magnitude = (low as f64).log2().floor() as u32;
        let largest = 2 * 10_u32.pow(u32::from(sigfig));
        let sub_bucket_count_magnitude = (f64::from(largest)).log2().ceil() as u32;
        let sub_bucket_half_count_magnitude = sub_bucket_count_magnitude - 1;
        let mut g = Geometry {
            low,
            high,
            sigfig,
            unit_magnitude,
            sub_bucket_half_count_magnitude,
            sub_bucket_half_count: 1 << sub_bucket_half_count_magnitude,
            max_index: 0,
        };
        g.max_index = g.index_of(high);
        Ok(g)
    }

    /// The bucket index of `value`, as the hdrhistogram crate computes it.
    pub fn index_of(&self, value: u64) -> u32 {
        let sub_bucket_mask =
            (u64::from(self.sub_bucket_half_count) * 2 - 1) << self.unit_magnitude;
        let base = 64 - self.unit_magnitude - self.sub_bucket_half_count_magnitude - 1;
        let bucket = base - (value | sub_bucket_mask).leading_zeros();
        let sub_bucket = (value >> (bucket + self.unit_magnitude)) as u32;
        ((bucket + 1) << self.sub_bucket_half_count_magnitude) + sub_bucket
            - self.sub_bucket_half_count
    }

    /// The highest bucket index of this geometry (the one holding `high`).
    pub fn max_index(&self) -> u32 {
        self.max_index
    }

    /// (lowest value of the bucket at `index`, log2 of its width).
    fn loc(&self, index: u32) -> (u64, u32) {
        let mut bucket_index = (index >> self.sub_bucket_half_count_magnitude) as i64 - 1;
        let mut sub_bucket_index =
            (index & (self.sub_bucket_half_count - 1)) + self.sub_bucket_half_count;
        if bucket_index < 0 {
            sub_bucket_index -= self.sub_bucket_half_count;
            bucket_index = 0;
        }
        let shift = bucket_index as u32 + self.unit_magnitude;
        (u64::from(sub_bucket_index) << shift, shift)
    }

    pub fn lowest_equivalent(&self, index: u32) -> u64 {
        self.loc(index).0
    }
    pub fn highest_equivalent(&self, index: u32) -> u64 {
        let (v, shift) = self.loc(index);
        v + (1u64 << shift) - 1
    }
    pub fn median_equivalent(&self, index: u32) -> u64 {
        let (v, shift) = self.loc(index);
        v + ((1u64 << shift) >> 1)
    }
}

/// A latency histogram as (bucket index, count) pairs sorted by index, with the geometry of the
/// histogram it came from. Percentiles follow HdrHistogram's definitions exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseHistogram {
    pub geometry: Geometry,
    buckets: Vec<(u32, u64)>,
    total: u64,
}

impl SparseHistogram {
    pub fn empty(geometry: Geometry) -> Self {
        SparseHistogram {
            geometry,
            buckets: Vec::new(),
            total: 0,
        }
    }

    /// Decodes any framing of V2 ([`Wire`]) without building the dense form.
    pub fn decode(bytes: &[u8]) -> Result<Self, HistogramCodecError> {
        let mut buckets = Vec::new();
        let (geometry, total) = BucketDecoder::default().decode(bytes, &mut buckets)?;
        Ok(SparseHistogram {
            geometry,
            buckets,
            total,
        })
    }

    /// A histogram from (index, count) pairs sorted by index with no zero counts (what
    /// [`BucketDecoder::decode`] and [`SparseHistogram::buckets`] give).
    pub fn from_sorted(geometry: Geometry, buckets: Vec<(u32, u64)>) -> Self {
        debug_assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0));
        let total = buckets.iter().map(|&(_, c)| c).sum();
        SparseHistogram {
            geometry,
            buckets,
            total,
        }
    }

    /// The (index, count) pairs, sorted by index.
    pub fn buckets(&self) -> &[(u32, u64)] {
        &self.buckets
    }

    pub fn from_dense(h: &Histogram<u64>) -> Self {
        let geometry = Geometry::new(h.low(), h.high(), h.sigfig()).expect("a valid histogram");
        let mut s = SparseHistogram::empty(geometry);
        // Round trip through the wire format keeps one definition of the indexes.
        if let Ok(bytes) = encode(h)
            && let Ok(d) = SparseHistogram::decode(&bytes)
        {
            s = d;
        }
        s
    }

    /// Builds the dense form (for writing logs and fio JSON percentiles with the crate).
    pub fn to_dense(&self) -> Histogram<u64> {
        let g = self.geometry;
        let mut h = Histogram::new_with_bounds(g.low, g.high, g.sigfig).expect("valid geometry");
        for &(i, c) in &self.buckets {
            h.saturating_record_n(g.lowest_equivalent(i), c);
        }
        h
    }

    pub fn len(&self) -> u64 {
        self.total
    }
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
    /// Buckets in use (memory is proportional to this).
    pub fn buckets_in_use(&self) -> usize {
        self.buckets.len()
    }

    /// Adds `other`'s counts: exact, like HdrHistogram's `add` on equal geometry.
    pub fn merge(&mut self, other: &SparseHistogram) -> Result<(), HistogramCodecError> {
        if other.total == 0 {
            return Ok(());
        }
        if self.geometry != other.geometry {
            if self.total == 0 {
                *self = other.clone();
                return Ok(());
            }
            return Err(HistogramCodecError::Decode(format!(
                "cannot merge histograms of different precision ({:?} vs {:?})",
                self.geometry, other.geometry
            )));
        }
        // A volume's total histogram soon holds every bucket its intervals use, so merging an
        // interval into it is mostly adding to buckets that exist: find them by binary search
        // and add in place, and only fall back to a full merge for the few new buckets.
        if other.buckets.len() * 8 < self.buckets.len() {
            let mut new = Vec::new();
            for &(i, c) in &other.buckets {
                match self.buckets.binary_search_by_key(&i, |&(j, _)| j) {
                    Ok(at) => self.buckets[at].1 += c,
                    Err(_) => new.push((i, c)),
                }
            }
            self.total += other.total;
            if !new.is_empty() {
                let total = self.total;
                let added = SparseHistogram {
                    geometry: self.geometry,
                    buckets: new,
                    total: 0,
                };
                self.merge_sorted(&added);
                self.total = total;
            }
            return Ok(());
        }
        self.merge_sorted(other);
        self.total += other.total;
        Ok(())
    }

    /// Merges two sorted bucket lists in place (counts of equal buckets add); `total` is left
    /// to the caller. One pass counts the buckets `other` adds; with none, counts are added in
    /// place; otherwise the list grows once and is merged from the back, so nothing is
    /// allocated per merge beyond that growth.
    fn merge_sorted(&mut self, other: &SparseHistogram) {
        let b = &other.buckets;
        let a_len = self.buckets.len();
        let mut new = 0;
        {
            let a = &self.buckets;
            let (mut i, mut j) = (0, 0);
            while j < b.len() {
                if i < a_len && a[i].0 < b[j].0 {
                    i += 1;
                } else if i < a_len && a[i].0 == b[j].0 {
                    i += 1;
                    j += 1;
                } else {
                    new += 1;
                    j += 1;
                }
            }
        }
        let a = &mut self.buckets;
        if new == 0 {
            let mut i = 0;
            for &(idx, c) in b {
                while a[i].0 < idx {
                    i += 1;
                }
                a[i].1 += c;
            }
            return;
        }
        a.resize(a_len + new, (0, 0));
        let (mut i, mut j, mut k) = (a_len, b.len(), a_len + new);
        while j > 0 {
            k -= 1;
            if i > 0 && a[i - 1].0 > b[j - 1].0 {
                a[k] = a[i - 1];
                i -= 1;
            } else if i > 0 && a[i - 1].0 == b[j - 1].0 {
                a[k] = (b[j - 1].0, a[i - 1].1 + b[j - 1].1);
                i -= 1;
                j -= 1;
            } else {
                a[k] = b[j - 1];
                j -= 1;
            }
        }
    }

    /// Adds the counts into a dense counts array indexed like HdrHistogram's (grown as needed):
    /// the cheapest way to merge many histograms into one that is finished later.
    pub fn add_to_dense(&self, dense: &mut Vec<u64>) {
        if let Some(&(last, _)) = self.buckets.last()
            && dense.len() <= last as usize
        {
            dense.resize(last as usize + 1, 0);
        }
        for &(i, c) in &self.buckets {
            dense[i as usize] += c;
        }
    }

    /// The sparse form of a dense counts array built with `add_to_dense`.
    pub fn from_counts(geometry: Geometry, dense: &[u64]) -> Self {
        let mut buckets = Vec::new();
        let mut total = 0;
        for (i, &c) in dense.iter().enumerate() {
            if c > 0 {
                buckets.push((i as u32, c));
                total += c;
            }
        }
        SparseHistogram {
            geometry,
            buckets,
            total,
        }
    }

    /// Quantiles, mean and max of the union of several histograms of one geometry, without
    /// building it (for per-interval figures of read and write together). `qs` ascending.
    pub fn union_stats(parts: &[&SparseHistogram], qs: &[f64]) -> UnionStats {
        let total: u64 = parts.iter().map(|p| p.total).sum();
        let mut out = UnionStats {
            count: total,
            quantiles: vec![0; qs.len()],
            mean: 0.0,
            max: 0,
        };
        let Some(g) = parts.iter().find(|p| p.total > 0).map(|p| p.geometry) else {
            return out;
        };
        let mut pos = vec![0usize; parts.len()];
        let targets: Vec<u64> = qs
            .iter()
            .map(|&q| ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1))
            .collect();
        let (mut acc, mut next_q, mut sum) = (0u64, 0usize, 0f64);
        loop {
            // The smallest current bucket index over the parts, with its summed count.
            let mut idx = u32::MAX;
            for (k, p) in parts.iter().enumerate() {
                if let Some(&(i, _)) = p.buckets.get(pos[k]) {
                    idx = idx.min(i);
                }
            }
            if idx == u32::MAX {
                break;
            }
            let mut c = 0;
            for (k, p) in parts.iter().enumerate() {
                if let Some(&(i, n)) = p.buckets.get(pos[k])
                    && i == idx
                {
                    c += n;
                    pos[k] += 1;
                }
            }
            acc += c;
            sum += g.median_equivalent(idx) as f64 * c as f64;
            while next_q < qs.len() && acc >= targets[next_q] {
                out.quantiles[next_q] = if qs[next_q] == 0.0 {
                    g.lowest_equivalent(idx)
                } else {
                    g.highest_equivalent(idx)
                };
                next_q += 1;
            }
            out.max = g.highest_equivalent(idx);
        }
        out.mean = if total > 0 { sum / total as f64 } else { 0.0 };
        out
    }

    /// HdrHistogram's `value_at_quantile`: the highest value equivalent to the bucket where the
    /// cumulative count first reaches ceil(q x total).
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let q = q.clamp(0.0, 1.0);
        let target = ((q * self.total as f64).ceil() as u64).max(1);
        let mut acc = 0;
        for &(i, c) in &self.buckets {
            acc += c;
            if acc >= target {
                return if q == 0.0 {
                    self.geometry.lowest_equivalent(i)
                } else {
                    self.geometry.highest_equivalent(i)
                };
            }
        }
        self.max()
    }

    pub fn value_at_percentile(&self, p: f64) -> u64 {
        self.value_at_quantile(p / 100.0)
    }

    /// `value_at_percentile` of each of `ps` (ascending) in one walk over the buckets: a
    /// summary asks for 17 percentiles, and 80,000 volumes' summaries took seconds one walk
    /// per percentile.
    pub fn values_at_percentiles(&self, ps: &[f64]) -> Vec<u64> {
        debug_assert!(ps.windows(2).all(|w| w[0] <= w[1]));
        let mut out = vec![0; ps.len()];
        if self.total == 0 {
            return out;
        }
        let targets: Vec<(f64, u64)> = ps
            .iter()
            .map(|&p| {
                let q = (p / 100.0).clamp(0.0, 1.0);
                (q, ((q * self.total as f64).ceil() as u64).max(1))
            })
            .collect();
        let (mut acc, mut next) = (0, 0);
        for &(i, c) in &self.buckets {
            acc += c;
            while next < ps.len() && acc >= targets[next].1 {
                out[next] = if targets[next].0 == 0.0 {
                    self.geometry.lowest_equivalent(i)
                } else {
                    self.geometry.highest_equivalent(i)
                };
                next += 1;
            }
            if next == ps.len() {
                break;
            }
        }
        for v in &mut out[next..] {
            *v = self.max();
        }
        out
    }

    pub fn min(&self) -> u64 {
        self.buckets
            .first()
            .map_or(0, |&(i, _)| self.geometry.lowest_equivalent(i))
    }
    pub fn max(&self) -> u64 {
        self.buckets
            .last()
            .map_or(0, |&(i, _)| self.geometry.highest_equivalent(i))
    }
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let sum: f64 = self
            .buckets
            .iter()
            .map(|&(i, c)| self.geometry.median_equivalent(i) as f64 * c as f64)
            .sum();
        sum / self.total as f64
    }
    pub fn stdev(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let mean = self.mean();
        let var: f64 = self
            .buckets
            .iter()
            .map(|&(i, c)| {
                let d = self.geometry.median_equivalent(i) as f64 - mean;
                d * d * c as f64
            })
            .sum();
        (var / self.total as f64).sqrt()
    }
}

/// Decodes wire histograms into (bucket index, count) lists, reusing its buffers from one
/// histogram to the next: the coordinator decodes 160,000 histograms a second at 10,000
/// agents x 8 volumes, and an allocation (or an inflater set-up) per histogram showed in its
/// profile. Stored-block framing is read in place; real deflate goes through one reused
/// inflater.
#[derive(Default)]
pub struct BucketDecoder {
    inflater: Option<flate2::Decompress>,
    buf: Vec<u8>,
}

impl BucketDecoder {
    /// Replaces `out` with the non-zero buckets of `bytes` in index order; returns the geometry
    /// and the total count.
    pub fn decode(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<(u32, u64)>,
    ) -> Result<(Geometry, u64), HistogramCodecError> {
        out.clear();
        let v2 = match be32(bytes, 0)? {
            V2_COOKIE => bytes,
            V2_COMPRESSED_COOKIE => {
                let len = be32(bytes, 4)? as usize;
                let body = bytes
                    .get(8..8 + len)
                    .ok_or_else(|| bad("truncated payload"))?;
                self.unwrap_zlib(body)?
            }
            _ => return Err(bad("not an HdrHistogram V2 encoding (wrong cookie)")),
        };
        if be32(v2, 0)? != V2_COOKIE {
            return Err(bad("not an HdrHistogram V2 encoding (wrong inner cookie)"));
        }
        let payload_len = be32(v2, 4)? as usize;
        if be32(v2, 8)? != 0 {
            return Err(bad("normalizing index offsets are not supported"));
        }
        let sigfig = be32(v2, 12)? as u8;
        let geometry = Geometry::new(be64(v2, 16)?, be64(v2, 24)?, sigfig)?;
        let payload = v2
            .get(40..40 + payload_len)
            .ok_or_else(|| bad("truncated counts"))?;
        let total = decode_counts(payload, geometry.max_index, out)?;
        Ok((geometry, total))
    }

    /// The V2 bytes inside a zlib stream: borrowed from it when its blocks are stored (one
    /// block) or copied out of them (several), otherwise inflated.
    fn unwrap_zlib<'a>(&'a mut self, z: &'a [u8]) -> Result<&'a [u8], HistogramCodecError> {
        match stored_blocks(z)? {
            Some(Stored::One(range)) => {
                let v2 = &z[range];
                check_adler(v2, z)?;
                Ok(v2)
            }
            Some(Stored::Many(ranges)) => {
                self.buf.clear();
                for r in ranges {
                    self.buf.extend_from_slice(&z[r]);
                }
                check_adler(&self.buf, z)?;
                Ok(&self.buf)
            }
            None => {
                self.inflate(z)?;
                Ok(&self.buf)
            }
        }
    }

    fn inflate(&mut self, z: &[u8]) -> Result<(), HistogramCodecError> {
        let d = self
            .inflater
            .get_or_insert_with(|| flate2::Decompress::new(true));
        d.reset(true);
        self.buf.clear();
        self.buf.reserve(z.len() * 4);
        loop {
            let (done_in, done_out) = (d.total_in() as usize, self.buf.len());
            let status = d
                .decompress_vec(
                    &z[done_in..],
                    &mut self.buf,
                    flate2::FlushDecompress::Finish,
                )
                .map_err(|e| bad(&format!("inflate: {e}")))?;
            if status == flate2::Status::StreamEnd {
                return Ok(());
            }
            let stuck = d.total_in() as usize == done_in && self.buf.len() == done_out;
            if stuck && self.buf.len() < self.buf.capacity() {
                return Err(bad("inflate: truncated stream"));
            }
            if self.buf.len() > MAX_INFLATED {
                return Err(bad("inflate: histogram larger than any valid one"));
            }
            self.buf.reserve(self.buf.capacity());
        }
    }
}

/// More than the V2 encoding of any lockstep histogram (9 bytes x 34,000 buckets at most).
const MAX_INFLATED: usize = 16 << 20;

enum Stored {
    One(std::ops::Range<usize>),
    Many(Vec<std::ops::Range<usize>>),
}

/// The payload ranges of a zlib stream made only of stored blocks, `None` if it has a
/// compressed block (to be inflated). Stored blocks start on byte boundaries when every block
/// before them is stored, so they are read bytewise.
fn stored_blocks(z: &[u8]) -> Result<Option<Stored>, HistogramCodecError> {
    let (&cmf, &flg) = (
        z.first().ok_or_else(|| bad("empty zlib stream"))?,
        z.get(1).ok_or_else(|| bad("truncated zlib header"))?,
    );
    if cmf & 0x0f != 8 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 || flg & 0x20 != 0 {
        return Err(bad("not a zlib stream"));
    }
    let mut at = 2;
    let mut ranges = Vec::new();
    loop {
        let header = *z.get(at).ok_or_else(|| bad("truncated zlib stream"))?;
        if (header >> 1) & 3 != 0 {
            return Ok(None);
        }
        let len = z
            .get(at + 1..at + 5)
            .ok_or_else(|| bad("truncated stored block"))?;
        let n = u16::from_le_bytes([len[0], len[1]]);
        if n != !u16::from_le_bytes([len[2], len[3]]) {
            return Err(bad("stored block length check failed"));
        }
        let r = at + 5..at + 5 + usize::from(n);
        if r.end > z.len() {
            return Err(bad("truncated stored block"));
        }
        at = r.end;
        ranges.push(r);
        if header & 1 == 1 {
            break;
        }
    }
    if ranges.len() == 1 {
        return Ok(Some(Stored::One(ranges.pop().unwrap())));
    }
    Ok(Some(Stored::Many(ranges)))
}

/// The adler-32 that closes a zlib stream (the last 4 bytes, which must follow the blocks).
fn check_adler(data: &[u8], z: &[u8]) -> Result<(), HistogramCodecError> {
    let want = z
        .len()
        .checked_sub(4)
        .map(|at| be32(z, at))
        .ok_or_else(|| bad("truncated zlib stream"))??;
    if adler32(data) != want {
        return Err(bad("zlib checksum mismatch"));
    }
    Ok(())
}

/// V2's counts: zig-zag LEB128 varints, a negative value being a run of that many empty
/// buckets. Most are one byte (counts below 64, runs below 65), which the loop takes first.
/// Counts and runs alternate with no pattern a branch predictor could learn, so the loop does
/// not branch on which one it read: it writes every entry and keeps the non-zero ones by
/// advancing the length (this loop was a fifth of the coordinator's merge profile).
fn decode_counts(
    payload: &[u8],
    max_index: u32,
    out: &mut Vec<(u32, u64)>,
) -> Result<u64, HistogramCodecError> {
    // Each entry takes a byte at least.
    out.reserve(payload.len());
    let base = out.len();
    let spare = &mut out.spare_capacity_mut()[..payload.len()];
    let (mut total, mut index, mut at, mut n) = (0u64, 0u64, 0, 0);
    while at < payload.len() {
        let b = payload[at];
        let raw = if b < 0x80 {
            at += 1;
            u64::from(b)
        } else {
            let (raw, used) = read_varint(&payload[at..]).ok_or_else(|| bad("bad varint"))?;
            at += used;
            raw
        };
        let run = raw & 1;
        // A count for an even value, 0 for a run.
        let count = (raw >> 1) & run.wrapping_sub(1);
        spare[n].write((index.min(u64::from(u32::MAX)) as u32, count));
        n += usize::from(count > 0);
        total += count;
        // A count moves one bucket on, a run (raw >> 1) + 1 buckets. Runs are capped off the
        // loop's dependency chain so `index` cannot wrap whatever the bytes: at most 2^32 + 1
        // per byte of a payload far below 2^31 bytes.
        index += ((raw >> 1).min(1 << 32) & run.wrapping_neg()) + 1;
    }
    // SAFETY: the first `n` entries of the spare capacity were written above.
    unsafe { out.set_len(base + n) };
    if let Some(&(last, _)) = out.last()
        && last > max_index
    {
        out.truncate(base);
        return Err(bad("a count beyond the histogram's highest value"));
    }
    Ok(total)
}

fn bad(m: &str) -> HistogramCodecError {
    HistogramCodecError::Decode(m.to_string())
}

fn be32(b: &[u8], at: usize) -> Result<u32, HistogramCodecError> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes(s.try_into().unwrap()))
        .ok_or_else(|| bad("truncated header"))
}

fn be64(b: &[u8], at: usize) -> Result<u64, HistogramCodecError> {
    b.get(at..at + 8)
        .map(|s| u64::from_be_bytes(s.try_into().unwrap()))
        .ok_or_else(|| bad("truncated header"))
}

/// What `SparseHistogram::union_stats` computes.
#[derive(Debug, Clone, PartialEq)]
pub struct UnionStats {
    pub count: u64,
    pub quantiles: Vec<u64>,
    pub mean: f64,
    pub max: u64,
}

/// The cookies carry a word-size nibble (0x10: 8-byte counts), as the crate writes them.
const V2_COOKIE: u32 = 0x1c84_9303 | 0x10;
const V2_COMPRESSED_COOKIE: u32 = 0x1c84_9304 | 0x10;

/// HdrHistogram's LEB128 variant: up to 8 bytes of 7 bits, a 9th byte of 8 bits.
fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for i in 0..9 {
        let byte = *b.get(i)?;
        if i == 8 {
            return Some((value | (u64::from(byte) << 56), 9));
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    fn lockstep_hist() -> Histogram<u64> {
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap()
    }

    proptest! {
        /// The sparse form computes exactly HdrHistogram's percentiles, before and after merging.
        #[test]
        fn sparse_matches_dense(
            a in prop::collection::vec((1u64..5_000_000_000u64, 1u64..50), 1..300),
            b in prop::collection::vec((1u64..50_000u64, 1u64..50), 0..300),
            wire in prop_oneof![Just(Wire::Deflate), Just(Wire::Stored), Just(Wire::Plain)],
        ) {
            let mut da = lockstep_hist();
            let mut db = lockstep_hist();
            for &(v, n) in &a { da.record_n(v, n).unwrap(); }
            for &(v, n) in &b { db.record_n(v, n).unwrap(); }
            let mut sa = SparseHistogram::decode(&encode_as(&da, wire).unwrap()).unwrap();
            let sb = SparseHistogram::decode(&encode_as(&db, wire).unwrap()).unwrap();
            // The standard reader takes every framing back to the same histogram.
            prop_assert_eq!(decode(&encode_as(&da, wire).unwrap()).unwrap().unwrap(), da.clone());
            sa.merge(&sb).unwrap();
            da.add(&db).unwrap();
            // Small into large (the in-place path), a few times over.
            let mut dc = lockstep_hist();
            dc.record_n(a[0].0, 3).unwrap();
            let sc = SparseHistogram::decode(&encode(&dc).unwrap()).unwrap();
            for _ in 0..3 {
                sa.merge(&sc).unwrap();
                da.add(&dc).unwrap();
            }
            prop_assert_eq!(sa.len(), da.len());
            for q in [0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
                prop_assert_eq!(sa.value_at_quantile(q), da.value_at_quantile(q), "q={}", q);
            }
            prop_assert_eq!(sa.max(), da.max());
            prop_assert_eq!(sa.min(), da.min());
            let ps = [0.0, 1.0, 50.0, 50.0, 99.0, 99.99, 100.0];
            prop_assert_eq!(
                sa.values_at_percentiles(&ps),
                ps.iter().map(|&p| da.value_at_percentile(p)).collect::<Vec<_>>()
            );
            prop_assert!((sa.mean() - da.mean()).abs() <= da.mean() * 1e-9 + 1e-9);
            let u = SparseHistogram::union_stats(&[&sa, &sb], &[0.5, 0.99]);
            let mut m = sa.clone();
            m.merge(&sb).unwrap();
            prop_assert_eq!(u.quantiles, vec![m.value_at_quantile(0.5), m.value_at_quantile(0.99)]);
            prop_assert_eq!(u.max, m.max());
            prop_assert!((u.mean - m.mean()).abs() <= m.mean() * 1e-9 + 1e-9);
            let mut dense = Vec::new();
            sa.add_to_dense(&mut dense);
            sb.add_to_dense(&mut dense);
            prop_assert_eq!(SparseHistogram::from_counts(sa.geometry, &dense), m);
            let back = sa.to_dense();
            prop_assert_eq!(back.value_at_quantile(0.99), da.value_at_quantile(0.99));
        }
    }

    proptest! {
        /// Bucket indexes mean the same values as in the hdrhistogram crate.
        #[test]
        fn index_of_matches_the_crate(v in 1u64..3_600_000_000_000u64) {
            let h = lockstep_hist();
            let g = Geometry::new(1, 3_600_000_000_000, 3).unwrap();
            let i = g.index_of(v);
            prop_assert_eq!(g.lowest_equivalent(i), h.lowest_equivalent(v));
            prop_assert_eq!(g.highest_equivalent(i), h.highest_equivalent(v));
            prop_assert!(i <= g.max_index());
        }
    }

    proptest! {
        /// Coarsening to 2 digits is exact: every 3-digit bucket lies inside one 2-digit
        /// bucket, each 2-digit bucket holds exactly the counts of the 3-digit buckets inside
        /// it, and the total is kept. Compared bucket by bucket on the decoded wire form.
        #[test]
        fn two_digit_buckets_are_unions_of_three_digit_ones(
            values in prop::collection::vec((1u64..3_600_000_000_000u64, 1u64..1000), 1..400),
        ) {
            let mut h = lockstep_hist();
            for &(v, n) in &values { h.record_n(v, n).unwrap(); }
            let fine = SparseHistogram::decode(&encode(&h).unwrap()).unwrap();
            let coarse = SparseHistogram::decode(&encode_at(&h, 2).unwrap()).unwrap();
            let (g3, g2) = (fine.geometry, coarse.geometry);
            prop_assert_eq!(g2.sigfig, 2);
            prop_assert_eq!(coarse.len(), h.len());
            let mut want: BTreeMap<u32, u64> = BTreeMap::new();
            for &(i, c) in fine.buckets() {
                let (lo, hi) = (g3.lowest_equivalent(i), g3.highest_equivalent(i));
                let j = g2.index_of(lo);
                prop_assert_eq!(j, g2.index_of(hi), "3-digit bucket {}..={} straddles", lo, hi);
                prop_assert!(g2.lowest_equivalent(j) <= lo && hi <= g2.highest_equivalent(j));
                *want.entry(j).or_default() += c;
            }
            prop_assert_eq!(coarse.buckets(), &want.into_iter().collect::<Vec<_>>()[..]);
            // Every recorded value lands in the 2-digit bucket that holds its 3-digit bucket.
            for &(v, _) in &values {
                let j = g2.index_of(v);
                prop_assert!(coarse.buckets().iter().any(|&(i, _)| i == j));
                prop_assert_eq!(j, g2.index_of(g3.highest_equivalent(g3.index_of(v))));
            }
            prop_assert_eq!(coarsen(&h, 3).unwrap(), h.clone());
        }
    }

    #[test]
    fn interval_digits_and_their_echo() {
        assert_eq!(interval_digits(0), Ok(3));
        assert_eq!(interval_digits(2), Ok(2));
        assert_eq!(interval_digits(3), Ok(3));
        for bad in [1, 4, 7, u32::MAX] {
            assert!(
                interval_digits(bad)
                    .unwrap_err()
                    .contains("histogram_digits")
            );
        }
        assert!(check_echoed_digits(3, 0).is_ok());
        assert!(check_echoed_digits(2, 2).is_ok());
        let old = check_echoed_digits(2, 0).unwrap_err();
        assert!(old.contains("did not confirm histogram_digits"), "{old}");
        assert!(check_echoed_digits(2, 3).is_err());
        assert!(check_echoed_digits(3, 2).is_err());
        let h = lockstep_hist();
        assert!(coarsen(&coarsen(&h, 2).unwrap(), 3).is_err());
    }

    fn spread(values: usize, count: u64) -> Histogram<u64> {
        let mut h = lockstep_hist();
        let g = Geometry::new(1, 3_600_000_000_000, 3).unwrap();
        for i in 0..values as u32 {
            h.record_n(g.lowest_equivalent(i * 2), count).unwrap();
        }
        h
    }

    #[test]
    fn stored_blocks_are_read_in_place_and_by_standard_inflaters() {
        // One block, and a histogram too big for one (over 64 KiB of V2).
        for h in [spread(1000, 3), spread(12_000, 1 << 40)] {
            let bytes = encode_as(&h, Wire::Stored).unwrap();
            assert_eq!(bytes[..4], V2_COMPRESSED_COOKIE.to_be_bytes());
            let s = SparseHistogram::decode(&bytes).unwrap();
            assert_eq!(s.len(), h.len());
            assert_eq!(s.buckets_in_use(), h.iter_recorded().count());
            // flate2's inflater (what hdrhistogram's reader and hlog tools use) agrees.
            let mut inflated = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::ZlibDecoder::new(&bytes[8..]),
                &mut inflated,
            )
            .unwrap();
            let mut plain = Vec::new();
            V2Serializer::new().serialize(&h, &mut plain).unwrap();
            assert_eq!(inflated, plain);
            assert_eq!(decode(&bytes).unwrap().unwrap(), h);
        }
        assert!(
            encode_as(&spread(12_000, 1 << 40), Wire::Stored)
                .unwrap()
                .len()
                > 65_535
        );
    }

    #[test]
    fn corrupt_encodings_are_refused() {
        let h = spread(500, 7);
        let stored = encode_as(&h, Wire::Stored).unwrap();
        let mut flipped = stored.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x10;
        let e = SparseHistogram::decode(&flipped).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        assert!(SparseHistogram::decode(&stored[..stored.len() - 3]).is_err());
        let deflated = encode_as(&h, Wire::Deflate).unwrap();
        assert!(SparseHistogram::decode(&deflated[..deflated.len() / 2]).is_err());
        // A count past the histogram's highest trackable value.
        let mut small = Histogram::<u64>::new_with_bounds(1, 2048, 3).unwrap();
        small.record(2000).unwrap();
        let mut plain = encode_as(&small, Wire::Plain).unwrap();
        let n = plain.len();
        plain[n - 1] = 0x7f; // the final varint: a run of 64 empty buckets
        plain.push(0x02); // then a count of 1
        let len = u32::from_be_bytes(plain[4..8].try_into().unwrap()) + 1;
        plain[4..8].copy_from_slice(&len.to_be_bytes());
        let e = SparseHistogram::decode(&plain).unwrap_err().to_string();
        assert!(e.contains("beyond"), "{e}");
    }

    #[test]
    fn round_trips_exactly() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        for v in [1u64, 100, 12_345, 1_000_000, 48_000_000, 3_000_000_000] {
            h.record_n(v, v % 7 + 1).unwrap();
        }
        let bytes = encode(&h).unwrap();
        let back = decode(&bytes).unwrap().unwrap();
        assert_eq!(back.len(), h.len());
        for q in [0.5, 0.9, 0.99, 0.999] {
            assert_eq!(back.value_at_quantile(q), h.value_at_quantile(q));
        }
        assert!(decode(&[]).unwrap().is_none());
        assert!(decode(&[1, 2, 3]).is_err());
    }
}
