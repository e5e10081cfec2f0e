//! Sweep mode end to end: `depth_sweep` runs the plan once per iodepth on real local agents
//! and real files, and reports latency against outstanding IOs (Little's law) per step, per
//! volume and for the role, with a verdict.
//!
//! `cargo test -p lockstep-tests --test sweep -- --nocapture` prints the measured table.

use lockstep::plan::SweepOver;
use lockstep_tests::{output_text, read_results, run_plan, scratch};

#[test]
fn a_depth_sweep_runs_one_step_per_depth_and_reports_latency_against_outstanding_ios() {
    let dir = scratch();
    let plan = r#"
name = "sweep"
duration = "3s"
[[role]]
name = "db"
depth_sweep = [1, 4]
[role.workload.fio]
rw = "randread"
bs = "4k"
size = "32m"
ioengine = "io_uring"
direct = 1
"#;
    let (o, out) = run_plan(dir.path(), plan, Some(2), &[]);
    let text = output_text(&o);
    assert!(o.status.success(), "{text}");
    println!("{}", String::from_utf8_lossy(&o.stdout));

    let r = read_results(&out);
    let series = r.series.as_ref().expect("a sweep's figures");
    assert!(series.curve.is_none(), "a sweep is not a curve");
    let role = &series.sweep.as_ref().expect("a sweep section").roles[0];
    assert_eq!(role.role, "db");
    assert_eq!(role.over, SweepOver::Iodepth);
    let steps = &role.steps;
    let depths: Vec<u32> = steps.iter().map(|s| s.depth).collect();
    assert_eq!(depths, [1, 4]);
    for s in steps {
        let depth = s.depth;
        let dir = &s.dir;
        assert!(dir.starts_with("sweep/") && dir.ends_with(&format!("-depth{depth}")));
        assert!(out.join(dir).join("results.json").is_file(), "{dir}");
        let volumes = &s.volumes;
        assert_eq!(volumes.len(), 2, "{s:?}");
        for v in volumes {
            assert!(v.lat.iops > 0.0, "{v:?}");
            assert!(v.lat.mean_ns > 0.0, "{v:?}");
            // One job per volume: as many IOs in flight as the step's depth.
            assert_eq!(v.outstanding, u64::from(depth), "{v:?}");
            assert!(v.littles_iops > 0.0, "{v:?}");
        }
        assert_eq!(s.role.outstanding, 2 * u64::from(depth));
        let iops = s.role.lat.iops;
        let sum: f64 = volumes.iter().map(|v| v.lat.iops).sum();
        assert!((iops - sum).abs() < 1e-6, "{s:?}");
        // The step's run was at that depth: the agents report what they configured.
        let step = read_results(&out.join(dir));
        for v in &step.volumes {
            assert_eq!(v.configured_depth, depth, "{v:?}");
        }
    }
    assert_eq!(role.volume_verdicts.len(), 2);
    assert!(!role.verdict.text.is_empty());

    // The report names the steps and the verdict; so does what was printed.
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    for t in [report.as_str(), &stdout] {
        assert!(t.contains("depth sweep, role db"), "{t}");
        assert!(t.contains("  verdict: "), "{t}");
        for d in [1, 4] {
            let row = format!("\n  {d:>7} {:>11} ", 2 * d);
            assert!(t.contains(&row), "no row for depth {d} in:\n{t}");
        }
    }
    assert!(text.contains("lockstep: sweep step depth 1:"), "{text}");
    assert!(text.contains("lockstep: sweep step depth 4:"), "{text}");
}
