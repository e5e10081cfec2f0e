//! The chokepoint finder end to end: six local agents, one of them on an emulated gp2 volume
//! whose burst credits run out mid-run; the report must name it, its onset and its kind, and
//! the forecast made before the cliff must be within 10% of the actual onset.

use lockstep::results::chokepoint::{ChokepointKind, Verdict};
use lockstep_tests::{output_text, read_results, read_timeline, run_plan, scratch};

const PLAN: &str = r#"
name = "credits"
duration = "24s"
interval = "1s"

[[role]]
name = "worker"
[role.workload.fio]
rw = "randrw"
rwmixread = 70
bs = "8k"
iodepth = 4
size = "32m"

# The peers: provisioned io1 at 1,000 IOPS, no credits.
[[fault]]
at = "0s"
target = { agents = ["agent-1", "agent-2", "agent-3", "agent-5", "agent-6"] }
kind = "ebs"
volume_type = "io1"
size_gib = 100
provisioned_iops = 1000

# The chokepoint: 60 GiB gp2, bursting at 3,000 IOPS until its credits (drained 300x fast)
# run out, then 180 IOPS.
[[fault]]
at = "0s"
target = { agents = ["agent-4"] }
kind = "ebs"
volume_type = "gp2"
size_gib = 60
time_scale = 300
"#;

#[test]
fn a_gp2_volume_running_out_of_credits_is_named_with_its_onset_and_forecast() {
    let dir = scratch();
    let (o, out) = run_plan(dir.path(), PLAN, Some(6), &["--fail-on-chokepoint"]);
    // --fail-on-chokepoint: a chokepoint was found, so the run exits 1.
    assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
    let r = read_results(&out);
    let c = r.chokepoint.as_ref().expect("a chokepoint section");
    let Verdict::Volume(v) = &c.verdict else {
        panic!("not a volume verdict: {:?}", c.verdict);
    };
    assert_eq!(v.node, "agent-4", "{v:?}");
    assert_eq!(v.volume, "data");
    assert_eq!(v.kind, ChokepointKind::CreditExhaustion, "{v:?}");
    // The onset is where the credits of a full bucket run out at the IOPS it did before:
    // 5.4M / 300 credits / (IOPS - 180 refill).
    let timeline = read_timeline(&out);
    let series = timeline
        .volumes
        .iter()
        .find(|s| s.node == "agent-4")
        .unwrap();
    let onset_ms = v.onset_ms;
    let before: Vec<f64> = series
        .points
        .iter()
        .filter(|p| p.t_ms + 1000 < onset_ms)
        .map(|p| (p.ios[0] + p.ios[1]) as f64 * 1000.0 / p.len_ms as f64)
        .collect();
    assert!(
        before.len() >= 3,
        "too few intervals before the onset at {onset_ms} ms"
    );
    let demand = before.iter().sum::<f64>() / before.len() as f64;
    let predicted_ms = 5.4e6 / 300.0 / (demand - 180.0) * 1000.0;
    assert!(
        (onset_ms as f64 - predicted_ms).abs() <= 2000.0,
        "onset {onset_ms} ms, the model predicts {predicted_ms:.0} ms at {demand:.0} IOPS"
    );
    // After the onset it holds the 180 IOPS baseline.
    let after: Vec<f64> = series
        .points
        .iter()
        .filter(|p| p.t_ms > onset_ms + 2000)
        .map(|p| (p.ios[0] + p.ios[1]) as f64 * 1000.0 / p.len_ms as f64)
        .collect();
    let mean_after = after.iter().sum::<f64>() / after.len() as f64;
    assert!(
        (mean_after - 180.0).abs() < 18.0,
        "{mean_after} IOPS after the onset"
    );
    // The forecast made before the cliff was within 10% of the actual onset.
    let f = &c.forecast_before_cliff;
    let err = f.as_ref().map_or(f64::NAN, |f| f.error_pct);
    assert!(err.abs() <= 10.0, "{f:?}");
    let text = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(
        text.contains("node agent-4, volume data (60 GiB gp2)") && text.contains("burst credits"),
        "{text}"
    );
}
