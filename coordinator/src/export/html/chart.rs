//! Line charts as inline SVG, drawn in Rust with plotters (no JavaScript charting library and
//! no network: the report opens from disk anywhere).

use plotters::prelude::*;

use crate::export::html::series::Line;

/// One chart: lines over a shared x axis, optional shaded x ranges (fault windows) and vertical
/// markers (the chokepoint's onset, a forecast).
pub struct Chart<'a> {
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub lines: Vec<Line>,
    /// (from, to, label): shaded.
    pub windows: Vec<(f64, f64, String)>,
    /// (x, label): a dashed vertical line.
    pub markers: Vec<(f64, String)>,
    /// A log y axis (latency spans decades when a volume falls off a cliff).
    pub log_y: bool,
    /// Lines drawn as points only (a curve's steps).
    pub points_only: bool,
    pub size: (u32, u32),
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

impl Chart<'_> {
    pub fn new<'a>(x_desc: &'a str, y_desc: &'a str, lines: Vec<Line>) -> Chart<'a> {
        Chart {
            x_desc,
            y_desc,
            lines,
            windows: Vec::new(),
            markers: Vec::new(),
            log_y: false,
            points_only: false,
            size: (900, 300),
        }
    }

    /// The chart as an `<svg>` element; a chart with no data says so instead.
    pub fn svg(&self) -> String {
        let pts = || self.lines.iter().flat_map(|l| l.points.iter());
        let finite = |v: f64| v.is_finite();
        let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
        for &(x, y) in pts().filter(|p| finite(p.0) && finite(p.1)) {
            if self.log_y && y <= 0.0 {
                continue;
            }
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            return "<p class=\"nodata\">no data</p>".into();
        }
        for (a, b, _) in &self.windows {
            x0 = x0.min(*a);
            x1 = x1.max(*b);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if self.log_y {
            y0 = (y0 * 0.8).max(1e-3);
            y1 = (y1 * 1.25).max(y0 * 10.0);
        } else {
            y0 = y0.min(0.0);
            y1 = if y1 <= y0 { y0 + 1.0 } else { y1 * 1.05 };
        }
        let mut buf = String::new();
        let drawn = if self.log_y {
            self.draw(&mut buf, x0..x1, (y0..y1).log_scale())
        } else {
            self.draw(&mut buf, x0..x1, y0..y1)
        };
        match drawn {
            Ok(()) => buf,
            Err(e) => format!(
                "<p class=\"nodata\">chart not drawn: {}</p>",
                super::esc(&e)
            ),
        }
    }

    fn draw<Y>(&self, buf: &mut String, x: std::ops::Range<f64>, y: Y) -> Result<(), String>
    where
        Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let root = SVGBackend::with_string(buf, self.size).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .light_line_style(WHITE.mix(0.0))
            .x_label_formatter(&|v| compact(*v))
            .y_label_formatter(&|v| compact(*v))
            .draw()
            .map_err(|x| e(&x))?;
        let (ylo, yhi) = {
            let r = chart.y_range();
            (r.start, r.end)
        };
        for (a, b, label) in &self.windows {
            let shade = RGBColor(255, 140, 0).mix(0.18).filled();
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(*a, ylo), (*b, yhi)],
                    shade,
                )))
                .map_err(|x| e(&x))?
                .label(label.clone())
                .legend(|(x, y)| {
                    Rectangle::new(
                        [(x, y - 5), (x + 16, y + 5)],
                        RGBColor(255, 140, 0).mix(0.3).filled(),
                    )
                });
        }
        for (at, label) in &self.markers {
            let style = RGBColor(120, 0, 0).stroke_width(2);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(*at, ylo), (*at, yhi)],
                    6,
                    4,
                    style,
                ))
                .map_err(|x| e(&x))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        }
        for (i, line) in self.lines.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = line
                .points
                .iter()
                .copied()
                .filter(|p| p.0.is_finite() && p.1.is_finite() && (!self.log_y || p.1 > 0.0))
                .collect();
            let anno = if self.points_only {
                chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
            } else {
                chart.draw_series(LineSeries::new(pts, c.stroke_width(2)))
            }
            .map_err(|x| e(&x))?;
            anno.label(line.name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
            });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
        Ok(())
    }
}

/// An axis label: "25M", "400k", "12", "0.5" rather than "25000000.0".
pub fn compact(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e9 {
        trim(format!("{:.1}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.1}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        trim(format!("{v:.2}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn axis_labels_are_compact() {
        assert_eq!(super::compact(25_000_000.0), "25M");
        assert_eq!(super::compact(400_000.0), "400k");
        assert_eq!(super::compact(2_500.0), "2500");
        assert_eq!(super::compact(0.0), "0");
        assert_eq!(super::compact(0.5), "0.5");
        assert_eq!(super::compact(1_500_000_000.0), "1.5G");
    }

    use super::*;

    #[test]
    fn a_chart_is_an_svg_with_one_polyline_per_line_and_its_legend() {
        let mut c = Chart::new(
            "t (s)",
            "IOPS",
            vec![
                Line::new("IOPS", vec![(1.0, 10.0), (2.0, 20.0), (3.0, 15.0)]),
                Line::new("peers", vec![(1.0, 12.0), (2.0, 12.0), (3.0, 12.0)]),
            ],
        );
        c.windows.push((1.5, 2.5, "fault ebs".into()));
        c.markers.push((2.0, "onset".into()));
        let svg = c.svg();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        // Each line in its palette colour, once drawn and once in the legend.
        let drawn = |colour: &str| {
            svg.lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(colour))
                .count()
        };
        assert_eq!(drawn("stroke=\"#1F77B4\""), 2, "{svg}");
        assert_eq!(drawn("stroke=\"#D62728\""), 2, "{svg}");
        for label in ["IOPS", "peers", "fault ebs", "onset", "t (s)"] {
            assert!(svg.contains(label), "{label}");
        }
    }

    #[test]
    fn a_log_chart_skips_zeros_and_an_empty_chart_says_so() {
        let c = Chart {
            log_y: true,
            ..Chart::new(
                "t",
                "us",
                vec![Line::new(
                    "p99",
                    vec![(0.0, 0.0), (1.0, 100.0), (2.0, 5000.0)],
                )],
            )
        };
        assert!(c.svg().starts_with("<svg"));
        assert!(Chart::new("t", "y", vec![]).svg().contains("no data"));
    }
}
