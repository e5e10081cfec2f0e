//! What a backup has not acknowledged, as coalesced byte ranges per file of the primary: the
//! catch-up's work list. Pure data structure.
//!
//! The invariant the catch-up relies on: the union of the ranges always covers every byte
//! inserted and not yet taken. The number of ranges is bounded (`limit`) so that a long
//! fail-over under random writes costs bounded memory: past the limit the closest ranges of a
//! file merge, and the bytes between them are sent again too (they are the primary's current
//! content, so resending them is harmless, only more to copy). The bound holds as long as there
//! are fewer files than `limit` (ranges of two files never merge).

use std::collections::BTreeMap;

/// One range of one file: `file` is the index of the primary's file in its clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub file: u32,
    pub start: u64,
    pub len: u64,
}

impl Range {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Coalesced ranges: `(file, start) -> end`, never overlapping or touching within a file.
#[derive(Debug, Clone)]
pub struct MissedRanges {
    ranges: BTreeMap<(u32, u64), u64>,
    limit: usize,
    bytes: u64,
}

impl MissedRanges {
    /// At most `limit` ranges (at least 2).
    pub fn new(limit: usize) -> MissedRanges {
        MissedRanges {
            ranges: BTreeMap::new(),
            limit: limit.max(2),
            bytes: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// The bytes the ranges cover (what a catch-up would send).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = Range> + '_ {
        self.ranges.iter().map(|(&(file, start), &end)| Range {
            file,
            start,
            len: end - start,
        })
    }

    /// Adds a range, merged with every range it overlaps or touches.
    pub fn insert(&mut self, r: Range) {
        if r.len == 0 {
            return;
        }
        let (mut start, mut end) = (r.start, r.end());
        // The range before it (starting at or before `start`) may reach it.
        if let Some((&(f, s), &e)) = self.ranges.range(..=(r.file, start)).next_back()
            && f == r.file
            && e >= start
        {
            start = s;
            end = end.max(e);
            self.remove_at(f, s);
        }
        // Ranges starting inside [start, end] are absorbed.
        while let Some((&(f, s), &e)) = self.ranges.range((r.file, start)..).next() {
            if f != r.file || s > end {
                break;
            }
            end = end.max(e);
            self.remove_at(f, s);
        }
        self.ranges.insert((r.file, start), end);
        self.bytes += end - start;
        if self.ranges.len() > self.limit {
            self.compact();
        }
    }

    /// Takes up to `max` bytes from the start of the first range (the catch-up's next chunk).
    pub fn take(&mut self, max: u64) -> Option<Range> {
        let (&(file, start), &end) = self.ranges.iter().next()?;
        let len = (end - start).min(max.max(1));
        self.remove_at(file, start);
        if start + len < end {
            self.ranges.insert((file, start + len), end);
            self.bytes += end - start - len;
        }
        Some(Range { file, start, len })
    }

    fn remove_at(&mut self, file: u32, start: u64) {
        if let Some(end) = self.ranges.remove(&(file, start)) {
            self.bytes -= end - start;
        }
    }

    /// Over the limit: merges the closest neighbours (same file) down to three quarters of the
    /// limit in one pass, so that a long run of inserts past the limit costs O(log n) each,
    /// not a scan of every range per insert.
    fn compact(&mut self) {
        let target = self.limit - self.limit / 4;
        let merges = self.ranges.len().saturating_sub(target);
        let all: Vec<Range> = self.iter().collect();
        let mut gaps: Vec<u64> = all
            .windows(2)
            .filter(|w| w[0].file == w[1].file)
            .map(|w| w[1].start - w[0].end())
            .collect();
        if gaps.is_empty() || merges == 0 {
            return;
        }
        let k = merges.min(gaps.len()) - 1;
        let (_, &mut threshold, _) = gaps.select_nth_unstable(k);
        // Every gap below the threshold merges, and as many at the threshold as still needed.
        let below = all
            .windows(2)
            .filter(|w| w[0].file == w[1].file && w[1].start - w[0].end() < threshold)
            .count();
        let mut at_threshold = merges.min(all.len() - 1).saturating_sub(below);
        self.ranges.clear();
        self.bytes = 0;
        let mut cur = all[0];
        for r in &all[1..] {
            let gap = (r.file == cur.file).then(|| r.start - cur.end());
            let merge = match gap {
                Some(g) if g < threshold => true,
                Some(g) if g == threshold && at_threshold > 0 => {
                    at_threshold -= 1;
                    true
                }
                _ => false,
            };
            if merge {
                cur.len = r.end() - cur.start;
            } else {
                self.ranges.insert((cur.file, cur.start), cur.end());
                self.bytes += cur.len;
                cur = *r;
            }
        }
        self.ranges.insert((cur.file, cur.start), cur.end());
        self.bytes += cur.len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(file: u32, start: u64, len: u64) -> Range {
        Range { file, start, len }
    }

    #[test]
    fn overlapping_and_touching_ranges_coalesce_but_not_across_files() {
        let mut m = MissedRanges::new(16);
        m.insert(r(0, 8192, 8192));
        m.insert(r(0, 0, 8192)); // touches: one range
        m.insert(r(0, 4096, 20_000)); // overlaps both, reaches further
        m.insert(r(1, 0, 4096)); // another file
        m.insert(r(0, 65_536, 4096));
        let v: Vec<Range> = m.iter().collect();
        assert_eq!(v, vec![r(0, 0, 24_096), r(0, 65_536, 4096), r(1, 0, 4096)]);
        assert_eq!(m.bytes(), 24_096 + 4096 + 4096);
    }

    #[test]
    fn take_hands_out_chunks_from_the_first_range() {
        let mut m = MissedRanges::new(16);
        m.insert(r(0, 0, 300_000));
        m.insert(r(2, 4096, 4096));
        assert_eq!(m.take(131_072), Some(r(0, 0, 131_072)));
        assert_eq!(m.take(131_072), Some(r(0, 131_072, 131_072)));
        assert_eq!(m.take(131_072), Some(r(0, 262_144, 37_856)));
        assert_eq!(m.take(131_072), Some(r(2, 4096, 4096)));
        assert_eq!(m.take(131_072), None);
        assert_eq!(m.bytes(), 0);
    }

    #[test]
    fn past_the_limit_the_closest_ranges_merge() {
        let mut m = MissedRanges::new(4);
        // Gaps of 1 and 2 KiB, then ~190 KiB: five ranges, over the limit of 4, merge down to
        // three (three quarters of it) by closing the two smallest gaps.
        m.insert(r(0, 0, 1024));
        m.insert(r(0, 2048, 1024));
        m.insert(r(0, 5120, 1024));
        m.insert(r(0, 200_000, 1024));
        m.insert(r(0, 400_000, 1024));
        let v: Vec<Range> = m.iter().collect();
        assert_eq!(
            v,
            vec![r(0, 0, 6144), r(0, 200_000, 1024), r(0, 400_000, 1024)]
        );
        assert_eq!(m.bytes(), 6144 + 2048);
    }

    /// What a brute-force byte set says is missed, for the properties.
    fn covered(m: &MissedRanges, file: u32, byte: u64) -> bool {
        m.iter()
            .any(|x| x.file == file && x.start <= byte && byte < x.end())
    }

    proptest! {
        #[test]
        fn the_ranges_cover_every_missed_byte_and_stay_within_the_limit(
            limit in 2usize..24,
            writes in prop::collection::vec((0u32..3, 0u64..4096, 1u64..64), 1..300),
            takes in prop::collection::vec(0u64..100, 0..20),
        ) {
            let mut m = MissedRanges::new(limit);
            let mut missed = std::collections::BTreeSet::new();
            for (i, &(file, start, len)) in writes.iter().enumerate() {
                m.insert(r(file, start, len));
                for b in start..start + len {
                    missed.insert((file, b));
                }
                prop_assert!(m.len() <= limit.max(3), "{} ranges, limit {limit}", m.len());
                // Take a chunk now and then: taken bytes are no longer owed.
                if let Some(&n) = takes.get(i % 37)
                    && i % 7 == 0
                    && let Some(t) = m.take(n)
                {
                    for b in t.start..t.end() {
                        missed.remove(&(t.file, b));
                    }
                }
            }
            for &(file, b) in &missed {
                prop_assert!(covered(&m, file, b), "byte {b} of file {file} not covered");
            }
            // Ranges never overlap or touch within a file, and `bytes` is their sum.
            let v: Vec<Range> = m.iter().collect();
            for w in v.windows(2) {
                prop_assert!(w[0].file != w[1].file || w[0].end() < w[1].start);
            }
            prop_assert_eq!(m.bytes(), v.iter().map(|x| x.len).sum::<u64>());
        }
    }
}
