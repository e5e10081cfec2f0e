//! Every plan in examples/ parses and resolves against the local cluster its own header says to
//! run it on (`lockstep run --local N examples/x.toml`), so an example never rots when the plan
//! format, a profile or a fault changes, and the command it shows is one that works.

use std::path::{Path, PathBuf};

use lockstep::orchestrate::local::LocalShape;
use lockstep::plan::{self, AgentInfo, AgentVolume};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.toml` under examples/, as `examples/...` paths relative to the repository.
fn examples() -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::from("examples")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(repo().join(&dir)).unwrap() {
            let e = e.unwrap();
            let rel = dir.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|x| x == "toml") {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The `--local` shape of the `lockstep run --local SHAPE examples/...` line in the plan's
/// header comment, which must name the plan itself.
fn local_shape(example: &str, text: &str) -> Result<LocalShape, String> {
    let command = text
        .lines()
        .take_while(|l| l.starts_with('#') || l.trim().is_empty())
        .find_map(|l| l.split("lockstep run --local ").nth(1))
        .ok_or("no `lockstep run --local N examples/...` line in the header comment")?;
    let mut words = command.split_whitespace();
    let shape: LocalShape = words.next().unwrap_or_default().parse()?;
    let file = words
        .next()
        .unwrap_or_default()
        .trim_end_matches([')', ',', '.', ';']);
    if file != example {
        return Err(format!("the header's command runs {file}, not {example}"));
    }
    Ok(shape)
}

/// The agents `--local SHAPE` starts, as the coordinator describes them to `resolve`.
fn local_agents(shape: LocalShape) -> Vec<AgentInfo> {
    (1..=shape.agents)
        .map(|i| {
            let name = format!("agent-{i}");
            AgentInfo {
                address: format!("127.0.0.1:{}", 7000 + i),
                labels: [("node".to_string(), name.clone())].into_iter().collect(),
                volumes: shape
                    .volume_names()
                    .into_iter()
                    .map(|v| AgentVolume {
                        path: PathBuf::from(format!("/tmp/{name}/{v}")),
                        name: v,
                        kind: "local".into(),
                        ..Default::default()
                    })
                    .collect(),
                name,
            }
        })
        .collect()
}

#[test]
fn every_example_parses_and_resolves_on_the_cluster_its_header_names() {
    let examples = examples();
    for story in [
        "examples/quickstart.toml",
        "examples/tableau-workers.toml",
        "examples/alteryx-workers.toml",
        "examples/iris-pair.toml",
        "examples/iris-mirrored-pair.toml",
        "examples/hadoop-volume-count.toml",
        "examples/mirror-drill.toml",
        "examples/ha-drill-fixed-rate.toml",
    ] {
        assert!(examples.iter().any(|e| e == story), "{story} is missing");
    }
    let mut failures = Vec::new();
    for example in &examples {
        let path = repo().join(example);
        let text = std::fs::read_to_string(&path).unwrap();
        let checked = local_shape(example, &text).and_then(|shape| {
            let plan = plan::load(&path).map_err(|e| e.to_string())?;
            let assignment =
                plan::resolve(&plan, &local_agents(shape)).map_err(|e| e.to_string())?;
            if assignment.agents.is_empty() {
                return Err("no agent gets any work".into());
            }
            Ok(())
        });
        if let Err(e) = checked {
            failures.push(format!("{example}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The check can fail: a plan naming an agent its cluster lacks, or a header running another
/// file, is caught.
#[test]
fn a_broken_example_is_caught() {
    let text = "# lockstep run --local 2 examples/x.toml\n";
    assert!(local_shape("examples/y.toml", text).is_err());
    assert!(local_shape("examples/x.toml", "name = \"x\"\n").is_err());
    let shape = local_shape("examples/x.toml", text).unwrap();
    let plan = plan::parse(
        r#"
name = "x"
duration = "10s"
[[role]]
name = "r"
select = { agents = ["agent-3"] }
workload = { profile = "oltp-8k" }
"#,
        Path::new("examples/x.toml"),
    )
    .unwrap();
    let e = plan::resolve(&plan, &local_agents(shape)).unwrap_err();
    assert!(e.to_string().contains("agent-3"), "{e}");
}
