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

/// The one reader of `results.chokepoint`: what the page shows of the finder's answer.
pub fn chokepoint_view(r: &RunResults) -> Option<ChokepointView> {
    use crate::results::chokepoint::Verdict;
    let c = r.chokepoint.as_ref()?;
    let verdict = serde_json::to_value(&c.verdict)
        .ok()
        .and_then(|v| json_name(v.get("verdict")?));
    let mut view = ChokepointView {
        text: crate::export::text::chokepoint::render_text(c),
        verdict: verdict.unwrap_or_else(|| "none".into()),
        ..Default::default()
    };
    match &c.verdict {
        Verdict::Volume(v) => {
            view.node = Some(v.node.clone());
            view.role = Some(v.role.clone());
            view.kind = json_name(v.kind);
            view.onset_ms = Some(v.onset_ms);
            view.volume = Some((v.node.clone(), v.volume.clone()));
        }
        Verdict::Node(n) => {
            view.node = Some(n.node.clone());
            view.onset_ms = Some(n.onset_ms);
        }
        Verdict::ClusterWide(cw) => view.onset_ms = Some(cw.onset_ms),
        Verdict::None | Verdict::LoadGeneratorBound(_) => {}
    }
    view.suspects = c
        .suspects
        .iter()
        .map(|x| format!("{}/{}", x.node, x.volume))
        .collect();
    let credit = match &c.verdict {
        Verdict::Volume(v) => v.evidence.credit.as_ref(),
        _ => None,
    };
    if let Some(credit) = credit {
        let m = &credit.model;
        view.credit = Some(CreditView {
            bucket: series::Bucket {
                baseline: m.baseline,
                burst: m.burst,
                bucket: m.bucket,
                time_scale: credit.time_scale,
            },
            unit: json_name(m.unit).unwrap_or_else(|| "io".into()),
            describe: format!("{} GiB {}", m.size_gib, m.kind),
            forecast_onset_ms: credit.forecast_onset_ms,
            before_cliff: c
                .forecast_before_cliff
                .as_ref()
                .map(|b| (b.made_at_ms, b.predicted_ms)),
        });
    }
    Some(view)
}

/// A value's name as results.json spells it ("volume", "credit_exhaustion", "io").
fn json_name(x: impl serde::Serialize) -> Option<String> {
    serde_json::to_value(x).ok()?.as_str().map(str::to_string)
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
