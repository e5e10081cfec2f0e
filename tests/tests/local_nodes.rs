//! `--local NxM`: agents with several volumes each, like datanodes with their disks, and the
//! chokepoint finder's node verdict on a real run: when every volume of one node slows down
//! together while the other nodes' do not, the finder names the node, not one of its volumes.

use lockstep::export::read_run_dir;
use lockstep::results::chokepoint::Verdict;
use lockstep_tests::{output_text, run_plan, scratch};

/// One node behind an instance limit of 600 IOPS from t=8 s (one ceiling its four disks share),
/// while the other nodes run free.
const PLAN: &str = include_str!("../../examples/chokepoint/node-limit.toml");

#[test]
fn a_node_whose_volumes_all_slow_together_is_named_as_the_node() {
    let dir = scratch();
    let (o, out) = run_plan(dir.path(), PLAN, None, &["--local", "3x4"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("starting 3 local agents of 4 volumes each"),
        "{stderr}"
    );
    let r = read_run_dir(&out).unwrap();
    // Twelve volumes named like a datanode's disks, four per node.
    let mut names: Vec<String> = r
        .volumes
        .iter()
        .map(|v| format!("{}/{}", v.node, v.volume))
        .collect();
    names.sort();
    assert_eq!(names.len(), 12, "{names:?}");
    assert!(names.contains(&"agent-1/data1".to_string()), "{names:?}");
    assert!(names.contains(&"agent-3/data4".to_string()), "{names:?}");
    for v in &r.volumes {
        assert!(v.summary.read.ios > 0, "{}/{} did no IO", v.node, v.volume);
    }
    let c = r.chokepoint.as_ref().expect("a chokepoint analysis");
    match &c.verdict {
        Verdict::Node(n) => {
            assert_eq!(n.node, "agent-2", "{n:?}");
            assert_eq!(n.volumes.len(), 4, "{n:?}");
            assert_eq!(n.volumes_total, 4, "{n:?}");
            // The fault starts at t=8 s (the onset is an interval start).
            assert!((7_000..=11_000).contains(&n.onset_ms), "{n:?}");
            // Four volumes sharing 600 IOPS.
            assert!(n.iops < 600.0 * 1.2, "{n:?}");
            // Found in the data: the node's sum sat flat at a ceiling, at most the instance's
            // 600 IOPS (12 volume loops on a loaded 2-core host reach 470-600 of it).
            let c = n.ceiling.as_ref().expect("a ceiling");
            assert_eq!(c.unit, "IOPS", "{n:?}");
            assert!((600.0 * 0.6..=600.0 * 1.05).contains(&c.value), "{n:?}");
            // Against 4 x 400 IOPS on the other nodes.
            assert!(n.peer_iops > 2.0 * n.iops, "{n:?}");
        }
        other => panic!(
            "expected the node agent-2, got {other:?}\n{}",
            output_text(&o)
        ),
    }
    // Not also one of its volumes on its own.
    assert!(
        !c.also
            .iter()
            .any(|v| matches!(v, Verdict::Volume(v) if v.node == "agent-2")),
        "{:?}",
        c.also
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("chokepoint: node agent-2: its 4 volumes together pinned at ")
            && text.contains(" IOPS from t="),
        "{text}"
    );
}
