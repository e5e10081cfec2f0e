//! report.html's "every volume at a glance": each volume's slowdown against the median of its
//! role's volumes, interval by interval, one pixel per cell of an inline PNG. At 8,000 volumes x
//! 3,600 intervals the cells are grouped (a group shows its worst cell), so the picture stays a
//! few hundred kilobytes and a slow volume still shows.

use std::collections::BTreeMap;

use crate::export::html::series::{interval_index, median};
use crate::results::timeline::Timeline;

/// Slowdown of each volume at each interval: latency / its role's median latency then, as log2
/// (0 = at the median, 1 = twice as slow). `None` where the volume did not report.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// "node/volume", in row order: the suspects first, then by typical slowdown.
    pub rows: Vec<String>,
    /// Per row, per interval.
    pub cells: Vec<Vec<Option<f32>>>,
    pub intervals: usize,
}

/// Builds the full-resolution heatmap; `suspects` ("node/volume") are put on top in the order
/// given, the rest follow by their mean slowdown, worst first.
pub fn slowdowns(t: &Timeline, suspects: &[String]) -> Heatmap {
    let iv = t.interval_ms;
    let indexes = || {
        t.volumes
            .iter()
            .flat_map(|s| s.points.iter().map(|p| interval_index(p, iv)))
    };
    // Columns from the first interval any volume reported (the first ends one interval in).
    let first = indexes().min().unwrap_or(0);
    let intervals = indexes().max().map_or(0, |m| m + 1 - first);
    let col = |p: &crate::results::timeline::VolumePoint| interval_index(p, iv) - first;
    // The role's median latency at each interval.
    let mut by_role: BTreeMap<&str, Vec<Vec<f64>>> = BTreeMap::new();
    for s in &t.volumes {
        let cols = by_role
            .entry(&s.role)
            .or_insert_with(|| vec![Vec::new(); intervals]);
        for p in &s.points {
            cols[col(p)].push(p.lat_mean_us);
        }
    }
    let medians: BTreeMap<&str, Vec<Option<f64>>> = by_role
        .into_iter()
        .map(|(role, cols)| {
            let m = cols.into_iter().map(|mut c| median(&mut c)).collect();
            (role, m)
        })
        .collect();
    let mut rows: Vec<(String, Vec<Option<f32>>, f64)> = t
        .volumes
        .iter()
        .map(|s| {
            let mut cells = vec![None; intervals];
            let m = &medians[s.role.as_str()];
            for p in &s.points {
                let i = col(p);
                if let Some(med) = m[i].filter(|m| *m > 0.0) {
                    cells[i] = Some((p.lat_mean_us.max(1e-3) / med).log2() as f32);
                }
            }
            let (sum, n) = cells
                .iter()
                .flatten()
                .fold((0.0, 0usize), |(s, n), c| (s + *c as f64, n + 1));
            let mean = if n == 0 { 0.0 } else { sum / n as f64 };
            (format!("{}/{}", s.node, s.volume), cells, mean)
        })
        .collect();
    let rank = |name: &str| suspects.iter().position(|s| s == name);
    rows.sort_by(|a, b| match (rank(&a.0), rank(&b.0)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)),
    });
    Heatmap {
        rows: rows.iter().map(|r| r.0.clone()).collect(),
        cells: rows.into_iter().map(|r| r.1).collect(),
        intervals,
    }
}

/// A grid of at most `max_rows` x `max_cols` cells: each is the worst (largest) slowdown of the
/// rows and intervals it stands for, so grouping never hides a slow volume.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    pub rows: usize,
    pub cols: usize,
    /// Volumes per grid row and intervals per grid column.
    pub rows_per_cell: usize,
    pub intervals_per_cell: usize,
    pub cells: Vec<Option<f32>>,
}

pub fn downsample(h: &Heatmap, max_rows: usize, max_cols: usize) -> Grid {
    let rows_per_cell = h.rows.len().div_ceil(max_rows.max(1)).max(1);
    let intervals_per_cell = h.intervals.div_ceil(max_cols.max(1)).max(1);
    let rows = h.rows.len().div_ceil(rows_per_cell);
    let cols = h.intervals.div_ceil(intervals_per_cell);
    let mut cells: Vec<Option<f32>> = vec![None; rows * cols];
    for (r, row) in h.cells.iter().enumerate() {
        let gr = r / rows_per_cell;
        for (i, c) in row.iter().enumerate() {
            if let Some(v) = c {
                let cell = &mut cells[gr * cols + i / intervals_per_cell];
                *cell = Some(cell.map_or(*v, |o| o.max(*v)));
            }
        }
    }
    Grid {
        rows,
        cols,
        rows_per_cell,
        intervals_per_cell,
        cells,
    }
}

/// The colour of a slowdown (log2): at or below the median white, 2x yellow-orange, 8x and
/// beyond dark red; no data grey.
pub fn colour(v: Option<f32>) -> [u8; 3] {
    let Some(v) = v else {
        return [200, 200, 200];
    };
    let x = (v / 3.0).clamp(0.0, 1.0);
    let lerp = |a: f32, b: f32, t: f32| (a + (b - a) * t).round() as u8;
    if x < 0.5 {
        let t = x * 2.0;
        [255, lerp(255.0, 170.0, t), lerp(255.0, 40.0, t)]
    } else {
        let t = (x - 0.5) * 2.0;
        [
            lerp(255.0, 120.0, t),
            lerp(170.0, 0.0, t),
            lerp(40.0, 0.0, t),
        ]
    }
}

/// The grid as an RGB PNG, one pixel per cell.
pub fn png(g: &Grid) -> Vec<u8> {
    let mut out = Vec::new();
    if g.rows == 0 || g.cols == 0 {
        return out;
    }
    let mut enc = png::Encoder::new(&mut out, g.cols as u32, g.rows as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Default);
    let data: Vec<u8> = g.cells.iter().flat_map(|c| colour(*c)).collect();
    // Writing to a Vec cannot fail; an encoder error here would be a size mismatch (a bug).
    let mut w = enc.write_header().expect("PNG header into memory");
    w.write_image_data(&data).expect("PNG data into memory");
    w.finish().expect("PNG end into memory");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::timeline::{VolumePoint, VolumeSeries};

    fn timeline(lat: &[(&str, &[f64])]) -> Timeline {
        Timeline {
            interval_ms: 1000,
            volumes: lat
                .iter()
                .map(|(node, ls)| VolumeSeries {
                    node: node.to_string(),
                    volume: "data".into(),
                    role: "w".into(),
                    points: ls
                        .iter()
                        .enumerate()
                        .map(|(i, l)| VolumePoint {
                            t_ms: (i as u64 + 1) * 1000,
                            len_ms: 1000,
                            lat_mean_us: *l,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            faults: vec![],
        }
    }

    #[test]
    fn the_slow_volume_sorts_first_and_reads_as_its_slowdown() {
        let t = timeline(&[
            ("a", &[100.0, 100.0, 100.0]),
            ("b", &[100.0, 800.0, 800.0]),
            ("c", &[100.0, 100.0, 100.0]),
        ]);
        let h = slowdowns(&t, &[]);
        assert_eq!(h.rows[0], "b/data");
        assert_eq!(h.intervals, 3);
        assert_eq!(h.cells[0][1], Some(3.0)); // 800 / median 100 = 8x = log2 3
        assert_eq!(h.cells[0][0], Some(0.0));
        // A named suspect goes on top whatever its figures.
        assert_eq!(slowdowns(&t, &["c/data".into()]).rows[0], "c/data");
    }

    #[test]
    fn grouping_8000_volumes_keeps_the_one_slow_cell() {
        let rows = 8000;
        let intervals = 3600;
        let mut cells = vec![vec![Some(0.0f32); intervals]; rows];
        cells[7321][2999] = Some(2.5);
        let h = Heatmap {
            rows: (0..rows).map(|i| format!("n{i}/d")).collect(),
            cells,
            intervals,
        };
        let g = downsample(&h, 1000, 1200);
        assert_eq!((g.rows, g.cols), (1000, 1200));
        assert_eq!((g.rows_per_cell, g.intervals_per_cell), (8, 3));
        assert_eq!(g.cells[(7321 / 8) * 1200 + 2999 / 3], Some(2.5));
        assert_eq!(g.cells.iter().filter(|c| **c == Some(2.5)).count(), 1);
        let png = png(&g);
        assert_eq!(&png[1..4], b"PNG");
        // Mostly one colour: it compresses to a few kilobytes, not 3.6 MB of pixels.
        assert!(png.len() < 100_000, "{}", png.len());
    }

    #[test]
    fn colours_run_from_white_through_orange_to_dark_red() {
        assert_eq!(colour(Some(0.0)), [255, 255, 255]);
        assert_eq!(colour(Some(-2.0)), [255, 255, 255]);
        assert_eq!(colour(Some(3.0)), [120, 0, 0]);
        assert_eq!(colour(None), [200, 200, 200]);
    }
}
