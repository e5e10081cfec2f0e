//! report.html: the run as pictures, one self-contained file that opens from disk with no
//! network (charts are inline SVG drawn by plotters, the volume heatmap an inline PNG, and a few
//! lines of inline JavaScript sort the tables). docs/report.md describes each section.
//!
//! Reads only `results` (docs/architecture.md, "The data flows one way"). Every read of the
//! chokepoint result is in `chokepoint_view`, the one place to adapt when it becomes typed.

pub mod chart;
pub mod heatmap;
pub mod page;
mod sections;
pub mod series;

use crate::results::RunResults;

/// The whole report.html of a run.
pub fn render(results: &RunResults) -> String {
    let view = chokepoint_view(results);
    let mut body = String::new();
    body.push_str(&sections::header(results, view.as_ref()));
    body.push_str(&sections::cluster_timeline(results, view.as_ref()));
    body.push_str(&sections::volume_heatmap(results, view.as_ref()));
    body.push_str(&sections::chokepoint(results, view.as_ref()));
    body.push_str(&sections::objectives(results));
    body.push_str(&sections::drills(results));
    body.push_str(&sections::curve(results));
    body.push_str(&sections::sweep(results));
    body.push_str(&sections::agents(results));
    body.push_str(&sections::volume_table(results));
    body.push_str(&sections::node_table(results));
    page::document(&format!("lockstep {}", results.run_id), &body)
}

/// What the report shows of the chokepoint finder's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChokepointView {
    /// The finder's text, as the text report prints it.
    pub text: String,
    /// "volume", "node", "cluster_wide", "load_generator_bound" or "none".
    pub verdict: String,
    /// The named volume ("node", "volume") for a volume verdict.
    pub volume: Option<(String, String)>,
    pub node: Option<String>,
    pub role: Option<String>,
    pub kind: Option<String>,
    pub onset_ms: Option<u64>,
    /// Other volumes still under suspicion ("node/volume").
    pub suspects: Vec<String>,
    pub credit: Option<CreditView>,
}

/// A credit-exhaustion verdict's model and forecasts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreditView {
    pub bucket: series::Bucket,
    /// "io" (gp2: IOPS) or "mib" (st1/sc1: MiB/s).
    pub unit: String,
    pub describe: String,
    /// When a full bucket runs out at the demand measured before the onset.
    pub forecast_onset_ms: Option<u64>,
    /// The forecast the finder made from the data before the cliff: (made at, predicted).
    pub before_cliff: Option<(u64, u64)>,
}

impl Default for series::Bucket {
    fn default() -> Self {
        series::Bucket {
            baseline: 0.0,
            burst: 0.0,
            bucket: 0.0,
            time_scale: 1.0,
        }
    }
}

/// The one reader of `results.chokepoint` (today an untyped value with the serialized
/// `analysis::chokepoint::Analysis` fields and a pre-rendered "text").
pub fn chokepoint_view(r: &RunResults) -> Option<ChokepointView> {
    let c = r.chokepoint.as_ref()?;
    let v = &c["verdict"];
    let s = |x: &serde_json::Value| x.as_str().map(str::to_string);
    let mut view = ChokepointView {
        text: s(&c["text"]).unwrap_or_default(),
        verdict: s(&v["verdict"]).unwrap_or_else(|| "none".into()),
        node: s(&v["node"]),
        role: s(&v["role"]),
        kind: s(&v["kind"]),
        onset_ms: v["onset_ms"].as_u64(),
        ..Default::default()
    };
    if view.verdict == "volume" {
        view.volume = view.node.clone().zip(s(&v["volume"]));
    }
    if let Some(list) = c["suspects"].as_array() {
        view.suspects = list
            .iter()
            .filter_map(|x| Some(format!("{}/{}", s(&x["node"])?, s(&x["volume"])?)))
            .collect();
    }
    let credit = &v["evidence"]["credit"];
    if let Some(m) = credit["model"].as_object() {
        let f = |k: &str| m.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
        let before = &c["forecast_before_cliff"];
        view.credit = Some(CreditView {
            bucket: series::Bucket {
                baseline: f("baseline"),
                burst: f("burst"),
                bucket: f("bucket"),
                time_scale: credit["time_scale"].as_f64().unwrap_or(1.0),
            },
            unit: m
                .get("unit")
                .and_then(|u| u.as_str())
                .unwrap_or("io")
                .into(),
            describe: format!(
                "{} GiB {}",
                f("size_gib"),
                m.get("kind").and_then(|k| k.as_str()).unwrap_or("")
            ),
            forecast_onset_ms: credit["forecast_onset_ms"].as_u64(),
            before_cliff: before["made_at_ms"]
                .as_u64()
                .zip(before["predicted_ms"].as_u64()),
        });
    }
    Some(view)
}

/// HTML-escapes text.
pub fn esc(s: &dyn std::fmt::Display) -> String {
    let s = s.to_string();
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests;
