//! Layout progress (issue #17): real agents laying out files big enough to take several
//! seconds report their bytes to the coordinator (`LayoutStatus`), and the coordinator, with no
//! terminal, prints a progress line at most every 5 s and a last line when the layout is done.

use lockstep_tests::{output_text, run_plan, scratch};

/// 2 agents x 1.5 GiB of files to fill with data (a read workload needs real data to read): at
/// the few hundred MB/s to 1 GB/s of this machine's disk, 3 to 10 s: a progress line per 5 s
/// of it.
const PLAN: &str = r#"
name = "layout-progress"
duration = "1s"
interval = "1s"

[[role]]
name = "reader"
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 1
size = "1536m"
"#;

/// (bytes done, bytes in all) from "laying out files: 1.20 GiB of 2.00 GiB (60%) ...".
fn progress_of(line: &str) -> Option<(f64, f64)> {
    let rest = line.split("laying out files: ").nth(1)?;
    let mut words = rest.split_whitespace();
    let done = to_bytes(words.next()?, words.next()?)?;
    (words.next()? == "of").then_some(())?;
    let total = to_bytes(words.next()?, words.next()?)?;
    Some((done, total))
}

fn to_bytes(n: &str, unit: &str) -> Option<f64> {
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

#[test]
fn a_long_layout_shows_growing_progress_and_its_end() {
    let dir = scratch();
    let (o, _out) = run_plan(dir.path(), PLAN, Some(2), &[]);
    let text = output_text(&o);
    assert!(o.status.success(), "lockstep run failed: {text}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let progress: Vec<(f64, f64)> = stderr.lines().filter_map(progress_of).collect();
    let last = stderr
        .lines()
        .find(|l| l.contains("lockstep: laid out "))
        .unwrap_or_else(|| panic!("no line for the end of the layout: {text}"));
    assert!(last.contains("laid out 3.00 GiB on 2 agents in "), "{last}");
    // How many lines a layout owes depends on how long it took on this disk (a fast one lays
    // 3 GiB out in 4 s): one line per 5 s of the layout's own reported time, and at least one
    // (the first poll is after 1 s, and 3 GiB take longer than that here).
    let took: f64 = last
        .rsplit(" in ")
        .next()
        .and_then(|t| t.trim().trim_end_matches('s').trim().parse().ok())
        .unwrap_or_else(|| panic!("no layout time in {last:?}"));
    let owed = ((took / 5.0).floor() as usize).max(1);
    assert!(
        progress.len() >= owed,
        "expected at least {owed} progress lines (one every 5 s of a {took} s layout): {text}"
    );
    let all = 3.0 * 1024.0 * 1024.0 * 1024.0;
    for w in progress.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "progress did not grow: {progress:?}\n{text}"
        );
    }
    for (done, total) in &progress {
        assert_eq!(
            *total, all,
            "the total is known from the first line: {text}"
        );
        assert!(*done <= all, "{text}");
    }
    // Lines are at most one per 5 s: a layout of well under a minute prints a handful.
    assert!(progress.len() <= 12, "{progress:?}");
}
