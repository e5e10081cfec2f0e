//! report.html's sections, each a function of the results (and the chokepoint view) to HTML.

use crate::export::html::chart::Chart;
use crate::export::html::page::{Cell, figure, lat_us, table};
use crate::export::html::series::{self, Line};
use crate::export::html::{ChokepointView, esc, heatmap};
use crate::results::timeline::{VolumePoint, VolumeSeries};
use crate::results::{RunResults, Summary};

/// Points per line on a chart: more than a 900-pixel-wide chart can show apart.
const MAX_POINTS: usize = 900;
/// The heatmap's largest picture (pixels); volumes and intervals beyond it are grouped.
const HEAT_ROWS: usize = 1000;
const HEAT_COLS: usize = 1200;

pub fn header(r: &RunResults, view: Option<&ChokepointView>) -> String {
    let failed = r.objectives.iter().filter(|o| !o.passed).count();
    let status = if r.objectives.is_empty() {
        String::new()
    } else if failed == 0 {
        "<span class=\"ok\">all objectives pass</span>".into()
    } else {
        format!("<span class=\"fail\">{failed} objective(s) fail</span>")
    };
    let c = &r.cluster.total;
    let mut s = format!(
        "<h1>lockstep: {}</h1><p class=\"sub\">run {} · {:?} · {:.0} s · {} agents · {} volumes · \
         {:.0} IOPS · {:.1} MB/s · p99 {} · {status}</p>\n",
        esc(&r.plan),
        esc(&r.run_id),
        r.status,
        r.duration_ms as f64 / 1000.0,
        r.agents.len(),
        r.volumes.len(),
        c.iops,
        c.bytes_per_sec / 1e6,
        lat_us(c.lat.p(99.0) as f64 / 1000.0),
    );
    if let Some(v) = view.filter(|v| !v.text.is_empty()) {
        s.push_str(&format!(
            "<div class=\"verdict\" id=\"verdict\">{}</div>\n",
            esc(&v.text)
        ));
    }
    for w in &r.warnings {
        s.push_str(&format!("<p class=\"fail\">{}</p>", esc(w)));
    }
    s
}

/// Fault windows merged when several volumes had the same fault at the same time (the
/// quickstart's EBS model is a fault on every volume for the whole run).
pub fn fault_windows(r: &RunResults) -> Vec<(f64, f64, String)> {
    // A fault still on at the end lasts to the last interval (the timeline counts the ramp).
    let last = r.cluster_timeline.last().map_or(0, |p| p.t_ms);
    let end = r.duration_ms.max(last) as f64 / 1000.0;
    let mut merged: Vec<(u64, Option<u64>, String, usize)> = Vec::new();
    for f in &r.faults {
        match merged
            .iter_mut()
            .find(|m| m.0 == f.start_ms && m.1 == f.end_ms && m.2 == f.fault)
        {
            Some(m) => m.3 += 1,
            None => merged.push((f.start_ms, f.end_ms, f.fault.clone(), 1)),
        }
    }
    merged
        .into_iter()
        // A model in force for the whole run is no window: shading all of it shows nothing.
        .filter(|m| !(m.0 == 0 && m.1.is_none_or(|e| e as f64 / 1000.0 >= end)))
        .map(|(a, b, name, n)| {
            let to = b.map_or(end, |b| b as f64 / 1000.0);
            (
                a as f64 / 1000.0,
                to,
                format!("fault {name} ({n} volume(s))"),
            )
        })
        .collect()
}

fn onset_marker(view: Option<&ChokepointView>) -> Vec<(f64, String)> {
    view.and_then(|v| {
        let at = v.onset_ms? as f64 / 1000.0;
        let who = v.volume.as_ref().map_or_else(
            || v.node.clone().unwrap_or_else(|| v.verdict.clone()),
            |(n, vol)| format!("{n}/{vol}"),
        );
        Some(vec![(at, format!("chokepoint onset: {who}"))])
    })
    .unwrap_or_default()
}

pub fn cluster_timeline(r: &RunResults, view: Option<&ChokepointView>) -> String {
    let t = &r.cluster_timeline;
    let pts = |f: &dyn Fn(&crate::results::ClusterPoint) -> f64| -> Vec<(f64, f64)> {
        t.iter().map(|p| (p.t_ms as f64 / 1000.0, f(p))).collect()
    };
    let windows = fault_windows(r);
    let markers = onset_marker(view);
    let with = |mut c: Chart<'static>| {
        c.windows = windows.clone();
        c.markers = markers.clone();
        c.svg()
    };
    let iops = Line::new(
        "IOPS",
        series::downsample_mean(&pts(&|p| p.iops), MAX_POINTS),
    );
    let mbs = Line::new(
        "MB/s",
        series::downsample_mean(&pts(&|p| p.bytes_per_sec / 1e6), MAX_POINTS),
    );
    let lat: Vec<Line> = [("p50", 0usize), ("p99", 1), ("p99.9", 2)]
        .iter()
        .map(|&(name, i)| {
            let l = pts(&|p| [p.lat_p50_us, p.lat_p99_us, p.lat_p999_us][i] / 1000.0);
            Line::new(name, series::downsample_max(&l, MAX_POINTS))
        })
        .collect();
    let mut s = String::from("<h2 id=\"timeline\">Cluster timeline</h2>\n");
    s.push_str(&figure(
        "chart-cluster-iops",
        &["IOPS"],
        &with(Chart::new("seconds since the start", "IOPS", vec![iops])),
        "Cluster IOPS per interval.",
    ));
    s.push_str(&figure(
        "chart-cluster-mbs",
        &["MB/s"],
        &with(Chart::new("seconds since the start", "MB/s", vec![mbs])),
        "Cluster throughput per interval.",
    ));
    s.push_str(&figure(
        "chart-cluster-latency",
        &["p50", "p99", "p99.9"],
        &with(Chart {
            log_y: true,
            ..Chart::new("seconds since the start", "latency (ms, log)", lat)
        }),
        "Cluster latency percentiles per interval, from the merged histograms of all volumes \
         (a bucket of intervals shows its worst).",
    ));
    s
}

pub fn volume_heatmap(r: &RunResults, view: Option<&ChokepointView>) -> String {
    let mut s = String::from("<h2 id=\"heatmap\">Every volume</h2>\n");
    if r.timeline.volumes.is_empty() {
        s.push_str(
            "<p class=\"nodata\">No per-volume timeline (timeline.json) with these results.</p>",
        );
        return s;
    }
    let mut suspects: Vec<String> = view
        .and_then(|v| v.volume.as_ref())
        .map(|(n, v)| vec![format!("{n}/{v}")])
        .unwrap_or_default();
    suspects.extend(view.map(|v| v.suspects.clone()).unwrap_or_default());
    let h = heatmap::slowdowns(&r.timeline, &suspects);
    let g = heatmap::downsample(&h, HEAT_ROWS, HEAT_COLS);
    // Many volumes: the suspects also get a labelled strip of their own above the map, where a
    // pixel row stands for several volumes.
    let named = h
        .rows
        .iter()
        .take_while(|n| suspects.contains(n))
        .count()
        .min(20);
    if g.rows > LABELLED_ROWS && named > 0 {
        let strip = heatmap::Heatmap {
            rows: h.rows[..named].to_vec(),
            cells: h.cells[..named].to_vec(),
            intervals: h.intervals,
        };
        s.push_str(&heat_image(
            "heatmap-suspects",
            &strip,
            &heatmap::downsample(&strip, named, HEAT_COLS),
        ));
        s.push_str("<p class=\"sub\">The suspects above; every volume below.</p>\n");
    }
    s.push_str(&format!(
        "<figure id=\"heatmap-figure\">{}\
         <figcaption>Each row {} volume(s), each column {} interval(s) of {} ms; \
         colour: mean latency over its role's median then \
         <span class=\"legend\">1x<span style=\"background:#fff;border:1px solid #ccc\"></span> \
         2x<span style=\"background:#ffd58a\"></span> 2.8x<span style=\"background:#ffaa28\"></span> \
         8x+<span style=\"background:#780000\"></span> no data<span style=\"background:#c8c8c8\"></span></span>; \
         a row or column standing for several shows the worst of them. Suspects on top, then by \
         typical slowdown. Top rows: {}.</figcaption></figure>\n",
        heat_image("heatmap", &h, &g),
        g.rows_per_cell,
        g.intervals_per_cell,
        r.timeline.interval_ms,
        esc(&h.rows.iter().take(5).cloned().collect::<Vec<_>>().join(", ")),
    ));
    s
}

/// Up to this many rows, each volume is a labelled 14-pixel band; beyond, a pixel row.
const LABELLED_ROWS: usize = 64;

fn heat_image(id: &str, h: &heatmap::Heatmap, g: &heatmap::Grid) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(heatmap::png(g));
    let labelled = g.rows <= LABELLED_ROWS && g.rows_per_cell == 1;
    let row_px = if labelled { 14 } else { 1 };
    let labels = if labelled {
        let names: Vec<String> = h.rows.iter().map(|n| esc(n)).collect();
        format!(
            "<div class=\"labels\" style=\"--row:{row_px}px\">{}</div>",
            names.join("<br>")
        )
    } else {
        String::new()
    };
    format!(
        "<div class=\"heat\">{labels}<img id=\"{id}\" alt=\"latency slowdown of each volume \
         against its role's median, over time\" style=\"height:{}px\" \
         src=\"data:image/png;base64,{b64}\"></div>",
        g.rows * row_px
    )
}

/// The chokepoint panel: the named volume against its peers' band, and for a credit model the
/// modeled balance running dry with the forecasts.
pub fn chokepoint(r: &RunResults, view: Option<&ChokepointView>) -> String {
    let mut s = String::from("<h2 id=\"chokepoint\">Chokepoint</h2>\n");
    let Some(v) = view else {
        s.push_str("<p class=\"nodata\">No chokepoint analysis in these results.</p>");
        return s;
    };
    let Some((node, volume)) = &v.volume else {
        s.push_str(&format!("<p>Verdict: {}</p>", esc(&v.verdict)));
        return s;
    };
    let Some(suspect) = r
        .timeline
        .volumes
        .iter()
        .find(|x| &x.node == node && &x.volume == volume)
    else {
        s.push_str("<p class=\"nodata\">The named volume has no timeline here.</p>");
        return s;
    };
    let peers: Vec<&VolumeSeries> = r
        .timeline
        .volumes
        .iter()
        .filter(|x| x.role == suspect.role && !(x.node == *node && x.volume == *volume))
        .collect();
    let name = format!("{node}/{volume}");
    let markers = onset_marker(view);
    for (id, unit, metric, log) in [
        (
            "chart-suspect-latency",
            "mean latency (ms, log)",
            lat_ms as fn(&VolumePoint) -> f64,
            true,
        ),
        (
            "chart-suspect-iops",
            "IOPS",
            VolumePoint::iops as fn(&VolumePoint) -> f64,
            false,
        ),
    ] {
        let band = series::peer_band(&peers, r.timeline.interval_ms, metric);
        let own: Vec<(f64, f64)> = suspect
            .points
            .iter()
            .map(|p| (p.t_ms as f64 / 1000.0, metric(p)))
            .collect();
        let lines = vec![
            Line::new(name.clone(), series::downsample_max(&own, MAX_POINTS)),
            Line::new(
                "peers' median",
                series::downsample_mean(&band.median, MAX_POINTS),
            ),
            Line::new(
                "peers' 10th percentile",
                series::downsample_mean(&band.low, MAX_POINTS),
            ),
            Line::new(
                "peers' 90th percentile",
                series::downsample_mean(&band.high, MAX_POINTS),
            ),
        ];
        let chart = Chart {
            log_y: log,
            markers: markers.clone(),
            ..Chart::new("seconds since the start", unit, lines)
        };
        s.push_str(&figure(
            id,
            &[
                &name,
                "peers' median",
                "peers' 10th percentile",
                "peers' 90th percentile",
            ],
            &chart.svg(),
            &format!(
                "{name} against the {} other volume(s) of role {}.",
                peers.len(),
                suspect.role
            ),
        ));
    }
    if let Some(c) = &v.credit {
        s.push_str(&credit_chart(suspect, c, &markers));
    }
    s
}

fn lat_ms(p: &VolumePoint) -> f64 {
    p.lat_mean_us / 1000.0
}

fn credit_chart(
    suspect: &VolumeSeries,
    c: &crate::export::html::CreditView,
    onset: &[(f64, String)],
) -> String {
    let demand: Vec<(f64, f64)> = suspect
        .points
        .iter()
        .map(|p| {
            let secs = (p.len_ms as f64 / 1000.0).max(1e-9);
            let ios = (p.ios[0] + p.ios[1]) as f64;
            let mib = (p.bytes[0] + p.bytes[1]) as f64 / (1024.0 * 1024.0);
            // gp2 counts IOs (256 KiB each at most), st1/sc1 MiB (small IOs as a full MiB).
            let d = if c.unit == "mib" {
                mib.max(ios)
            } else {
                ios.max(mib * 4.0)
            };
            (p.t_ms as f64 / 1000.0, d / secs)
        })
        .collect();
    let balance = series::credit_balance(&c.bucket, &demand);
    let mut markers = onset.to_vec();
    if let Some(f) = c.forecast_onset_ms {
        markers.push((
            f as f64 / 1000.0,
            format!(
                "forecast at the measured demand: t={:.0}s",
                f as f64 / 1000.0
            ),
        ));
    }
    if let Some((made, at)) = c.before_cliff {
        markers.push((
            at as f64 / 1000.0,
            format!(
                "forecast made at t={:.0}s: empty at t={:.0}s",
                made as f64 / 1000.0,
                at as f64 / 1000.0
            ),
        ));
    }
    let chart = Chart {
        markers,
        ..Chart::new(
            "seconds since the start",
            "credits",
            vec![Line::new(
                "modeled credit balance",
                series::downsample_mean(&balance, MAX_POINTS),
            )],
        )
    };
    figure(
        "chart-credit-balance",
        &["modeled credit balance"],
        &chart.svg(),
        &format!(
            "{}: bucket {:.0}, baseline {:.0}, burst {:.0}, emulated {}x faster than real; the \
             balance is modeled from the measured demand, starting full.",
            c.describe, c.bucket.bucket, c.bucket.baseline, c.bucket.burst, c.bucket.time_scale
        ),
    )
}

pub fn objectives(r: &RunResults) -> String {
    let mut s = String::from("<h2 id=\"objectives\">Objectives</h2>\n");
    if r.objectives.is_empty() {
        s.push_str("<p class=\"nodata\">The plan sets no objectives.</p>");
        return s;
    }
    let rows = r
        .objectives
        .iter()
        .map(|o| {
            vec![
                Cell::text(&o.objective),
                Cell::html(if o.passed {
                    "<span class=\"ok\">pass</span>".into()
                } else {
                    "<span class=\"fail\">FAIL</span>".into()
                }),
                Cell::text(o.failures.join("; ")),
            ]
        })
        .collect();
    s.push_str(&table(
        "objectives-table",
        &["objective", "result", "where it failed"],
        rows,
    ));
    s
}

pub fn drills(r: &RunResults) -> String {
    let Some(d) = &r.drill else {
        return String::new();
    };
    let mut s = String::from("<h2 id=\"drills\">Drills</h2>\n");
    let win = |w: &Option<crate::results::drill::WindowStats>| match w {
        Some(w) => format!(
            "{:.0} IOPS, p99 {}",
            w.iops,
            lat_us(w.lat.p99_ns as f64 / 1000.0)
        ),
        None => "-".into(),
    };
    let mut rows = Vec::new();
    for f in &d.faults {
        for t in std::iter::once(&f.cluster).chain(&f.volumes) {
            rows.push(vec![
                Cell::text(format!(
                    "{} at t={:.0}s",
                    f.fault,
                    f.start_ms as f64 / 1000.0
                )),
                Cell::text(&t.target),
                Cell::text(win(&t.baseline)),
                Cell::text(win(&t.during)),
                Cell::text(win(&t.after)),
                Cell::text(match t.recovery.recovery_ms {
                    Some(ms) => format!("{:.1} s", ms as f64 / 1000.0),
                    None => t.recovery.note.clone(),
                }),
            ]);
        }
    }
    s.push_str(&table(
        "drills-table",
        &["fault", "target", "baseline", "during", "after", "recovery"],
        rows,
    ));
    s
}

pub fn curve(r: &RunResults) -> String {
    let Some(c) = r.series.as_ref().and_then(|s| s.curve.as_ref()) else {
        return String::new();
    };
    let mut s = String::from("<h2 id=\"curve\">Latency against IOPS</h2>\n");
    for role in &c.roles {
        let line = |name: &str, f: fn(&crate::results::curve::StepFigures) -> u64| {
            Line::new(
                name,
                role.steps
                    .iter()
                    .map(|st| (st.role.iops, f(&st.role) as f64 / 1e6))
                    .collect(),
            )
        };
        let chart = Chart {
            log_y: true,
            ..Chart::new(
                "IOPS",
                "latency (ms, log)",
                vec![
                    line("p50", |f| f.p50_ns),
                    line("p99", |f| f.p99_ns),
                    line("p99.9", |f| f.p999_ns),
                ],
            )
        };
        s.push_str(&figure(
            &format!("chart-curve-{}", role.role),
            &["p50", "p99", "p99.9"],
            &chart.svg(),
            &format!(
                "Role {}: one point per step (up to {:.0} IOPS a volume).",
                role.role, role.max_iops_per_volume
            ),
        ));
    }
    s
}

pub fn sweep(r: &RunResults) -> String {
    let Some(sw) = r.series.as_ref().and_then(|s| s.sweep.as_ref()) else {
        return String::new();
    };
    let mut s = String::from("<h2 id=\"sweep\">Latency against outstanding IOs</h2>\n");
    for role in &sw.roles {
        let measured = role
            .steps
            .iter()
            .map(|st| (st.role.outstanding as f64, st.role.lat.mean_ns / 1e6))
            .collect();
        // Little's law: latency = IOs in flight / IOPS.
        let littles = role
            .steps
            .iter()
            .filter(|st| st.role.lat.iops > 0.0)
            .map(|st| {
                (
                    st.role.outstanding as f64,
                    st.role.in_flight_mean / st.role.lat.iops * 1000.0,
                )
            })
            .collect();
        let chart = Chart::new(
            "outstanding IOs",
            "mean latency (ms)",
            vec![
                Line::new("measured", measured),
                Line::new("Little's law (in flight / IOPS)", littles),
            ],
        );
        s.push_str(&figure(
            &format!("chart-sweep-{}", role.role),
            &["measured", "Little's law (in flight / IOPS)"],
            &chart.svg(),
            &format!("Role {}: {}", role.role, role.verdict.text),
        ));
        // Where it stops scaling, in words (per node for a volumes sweep).
        for k in &role.answers {
            s.push_str(&format!(
                "<p class=\"answer\">{}: {}</p>\n",
                esc(&k.target),
                esc(&k.text)
            ));
        }
    }
    s
}

pub fn agents(r: &RunResults) -> String {
    let mut s = format!(
        "<h2 id=\"agents\">Start skew and clocks</h2>\n<p>Measured start skew of the run: {}.</p>\n",
        r.start_skew_ns
            .map_or("not measured".into(), |ns| lat_us(ns as f64 / 1000.0))
    );
    let rows = r
        .agents
        .iter()
        .map(|a| {
            let ns = |x: i64| Cell::num(format!("{:+.3} ms", x as f64 / 1e6), x as f64);
            vec![
                Cell::text(&a.name),
                Cell::text(&a.hostname),
                a.start_lateness_ns.map_or(Cell::text("-"), ns),
                ns(a.clock.offset_ns),
                ns(a.clock.rtt_ns),
                Cell::text(match &a.state {
                    crate::results::AgentState::Finished => "finished".to_string(),
                    crate::results::AgentState::Lost { at_ms, reason } => {
                        format!("lost at t={:.1}s: {reason}", *at_ms as f64 / 1000.0)
                    }
                    crate::results::AgentState::Failed { reason } => format!("failed: {reason}"),
                }),
            ]
        })
        .collect();
    s.push_str(&table(
        "agents-table",
        &[
            "agent",
            "host",
            "start lateness",
            "clock offset",
            "round trip",
            "state",
        ],
        rows,
    ));
    s
}

fn summary_cells(sm: &Summary) -> Vec<Cell> {
    let t = &sm.total;
    let p = |q: f64| {
        let us = t.lat.p(q) as f64 / 1000.0;
        Cell::num(lat_us(us), us)
    };
    vec![
        Cell::num(format!("{:.0}", t.iops), t.iops),
        Cell::num(format!("{:.1}", t.bytes_per_sec / 1e6), t.bytes_per_sec),
        p(50.0),
        p(99.0),
        p(99.9),
        Cell::num(lat_us(t.lat.max_ns as f64 / 1000.0), t.lat.max_ns as f64),
        Cell::num(t.errors, t.errors as f64),
    ]
}

/// Volumes listed in the table at most: beyond a few thousand rows a browser takes seconds to
/// lay the page out, and nobody reads them; the rest are in results.json and timeline.csv.
pub const MAX_VOLUME_ROWS: usize = 1000;

pub fn volume_table(r: &RunResults) -> String {
    let mut shown: Vec<&crate::results::VolumeResult> = r.volumes.iter().collect();
    let note = if shown.len() > MAX_VOLUME_ROWS {
        // The slowest first: the ones a reader looks for.
        shown.sort_by_key(|v| std::cmp::Reverse(v.summary.total.lat.p(99.0)));
        shown.truncate(MAX_VOLUME_ROWS);
        format!(
            "<p>The {MAX_VOLUME_ROWS} volumes with the highest p99 of {}; every volume is in \
             results.json and timeline.csv.</p>\n",
            r.volumes.len()
        )
    } else {
        String::new()
    };
    let rows = shown
        .into_iter()
        .map(|v| {
            let mut row = vec![
                Cell::text(&v.node),
                Cell::text(&v.volume),
                Cell::text(&v.role),
                Cell::text(
                    v.model
                        .as_ref()
                        .map_or(String::new(), |m| match m.size_gib {
                            s if s > 0.0 => format!("{} {s} GiB", m.kind),
                            _ => m.kind.clone(),
                        }),
                ),
            ];
            row.extend(summary_cells(&v.summary));
            row.push(Cell::num(
                format!("{:.1} / {}", v.outstanding_mean, v.configured_depth),
                v.outstanding_mean,
            ));
            row
        })
        .collect();
    format!(
        "<h2 id=\"volumes\">Volumes</h2>\n{note}{}",
        table(
            "volumes-table",
            &[
                "node",
                "volume",
                "role",
                "model",
                "IOPS",
                "MB/s",
                "p50",
                "p99",
                "p99.9",
                "max",
                "errors",
                "outstanding / depth"
            ],
            rows,
        )
    )
}

pub fn node_table(r: &RunResults) -> String {
    let mut rows: Vec<Vec<Cell>> = r
        .nodes
        .iter()
        .map(|n| {
            let mut row = vec![Cell::text(&n.node)];
            row.extend(summary_cells(&n.summary));
            row
        })
        .collect();
    let mut all = vec![Cell::text("cluster")];
    all.extend(summary_cells(&r.cluster));
    rows.push(all);
    format!(
        "<h2 id=\"nodes\">Nodes</h2>\n{}",
        table(
            "nodes-table",
            &[
                "node", "IOPS", "MB/s", "p50", "p99", "p99.9", "max", "errors"
            ],
            rows
        )
    )
}
