//! The registry read at scale against a real etcd: a prefix larger than one page, or than one
//! gRPC response, is listed whole and nothing beside it; the watched membership follows joins,
//! clean leaves and expiries after a snapshot that took several pages. Agents register through
//! the agents' own `keep_registered_on`, each under its own lease.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, Txn, TxnOp};
use lockstep::orchestrate::registry::{Change, ListOptions, Membership, list, list_with};
use lockstep_agent::registry::{
    RegisteredCapabilities, Registration, RegistryOptions, agent_key, connect_options,
    keep_registered_on,
};
use lockstep_tests::Etcd;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

fn reg(name: &str) -> Registration {
    Registration {
        name: name.into(),
        address: "127.0.0.1:7070".into(),
        labels: BTreeMap::new(),
        volumes: Vec::new(),
        version: "0.1.0".into(),
        protocol_version: 1,
        capabilities: RegisteredCapabilities::default(),
        tls: false,
        hostname: "h".into(),
        registered_unix_ms: 0,
    }
}

/// A registered agent: its keep-alive task and the signal that revokes its lease.
struct Registered(JoinHandle<()>, oneshot::Sender<()>);

fn register(client: &Client, etcd: &Etcd, name: &str, ttl_s: u64) -> Registered {
    let opts = RegistryOptions {
        endpoints: vec![etcd.url.clone()],
        prefix: "/lockstep".into(),
        ttl: Duration::from_secs(ttl_s),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(keep_registered_on(
        Some(client.clone()),
        opts,
        reg(name),
        async move {
            let _ = rx.await;
        },
    ));
    Registered(task, tx)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn names(etcd: &Etcd, page: i64) -> Vec<String> {
    let opts = ListOptions {
        page,
        lease_ttls: true,
    };
    let l = list_with(std::slice::from_ref(&etcd.url), "/lockstep", opts)
        .await
        .expect("listing");
    assert!(
        l.iter()
            .all(|a| a.lease_ttl_left_s.is_some_and(|t| (0..=5).contains(&t))),
        "every agent's lease TTL is asked"
    );
    l.into_iter().map(|a| a.registration.name).collect()
}

async fn until_listed(etcd: &Etcd, n: usize) {
    for _ in 0..500 {
        if names(etcd, 100).await.len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never {n} agents listed: {:?}", names(etcd, 100).await);
}

#[test]
fn a_registry_larger_than_one_page_or_one_grpc_response_is_listed_whole() {
    let etcd = Etcd::start();
    rt().block_on(async {
        let mut client = Client::connect([&etcd.url], Some(connect_options()))
            .await
            .unwrap();
        let agents: Vec<Registered> = (0..12)
            .map(|i| register(&client, &etcd, &format!("a{i:02}"), 5))
            .collect();
        // Keys just outside the prefix, and one inside it that is not a registration.
        for (k, v) in [
            ("/lockstep/agents0", "x"),
            ("/lockstep/agent", "x"),
            ("/lockstep/agents/zz-not-an-agent", "{"),
        ] {
            client.put(k, v, None).await.unwrap();
        }
        until_listed(&etcd, 12).await;
        let want: Vec<String> = (0..12).map(|i| format!("a{i:02}")).collect();
        for page in [1, 5, 12, 13, 500] {
            assert_eq!(names(&etcd, page).await, want, "page of {page} keys");
        }

        // 360 registrations of 12 KB (a label that large is unusual; the sum, 4.4 MB, is what
        // 3,200 agents of 8 volumes register): more than the client takes in one response.
        let big = "x".repeat(12_000);
        for batch in 0..12 {
            let ops: Vec<TxnOp> = (0..30)
                .map(|i| {
                    let mut r = reg(&format!("b{:03}", batch * 30 + i));
                    r.labels.insert("note".into(), big.clone());
                    TxnOp::put(
                        agent_key("/lockstep", &r.name),
                        serde_json::to_vec(&r).unwrap(),
                        None,
                    )
                })
                .collect();
            client.txn(Txn::new().and_then(ops)).await.unwrap();
        }
        let all = list(std::slice::from_ref(&etcd.url), "/lockstep")
            .await
            .expect("listing");
        assert_eq!(all.len(), 372);
        assert_eq!(all[0].registration.name, "a00");
        assert_eq!(all[371].registration.name, "b359");
        assert_eq!(all[371].lease_ttl_left_s, None, "a key without a lease");
        drop(agents);
    });
}

async fn next(m: &mut Membership) -> Vec<Change> {
    tokio::time::timeout(Duration::from_secs(15), m.changes())
        .await
        .expect("a change within 15 s")
        .expect("the watch")
}

#[test]
fn the_membership_follows_joins_leaves_and_expiries_after_a_paged_snapshot() {
    let etcd = Etcd::start();
    rt().block_on(async {
        let client = Client::connect([&etcd.url], Some(connect_options()))
            .await
            .unwrap();
        let mut agents: Vec<Registered> = (0..5)
            .map(|i| register(&client, &etcd, &format!("a{i}"), 2))
            .collect();
        until_listed(&etcd, 5).await;
        let eps = [etcd.url.clone()];
        let mut m = Membership::start_with(&eps, "/lockstep", 2).await.unwrap();
        let names: Vec<&String> = m.agents().keys().collect();
        assert_eq!(names, ["a0", "a1", "a2", "a3", "a4"]);

        let _new = register(&client, &etcd, "a5", 2);
        assert!(
            matches!(&next(&mut m).await[..], [Change::Joined(r)] if r.name == "a5"),
            "a registration is one Joined"
        );
        let Registered(task, stop) = agents.remove(0);
        stop.send(()).unwrap();
        task.await.unwrap();
        assert_eq!(next(&mut m).await, [Change::Left("a0".into())]);
        // No revoke: the lease runs out (TTL 2 s) and etcd deletes the key.
        let Registered(task, _stop) = agents.remove(0);
        task.abort();
        let t = std::time::Instant::now();
        assert_eq!(next(&mut m).await, [Change::Left("a1".into())]);
        eprintln!(
            "expiry seen by the watch {:.0} ms after the keep-alive stopped (TTL 2 s)",
            t.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(m.agents().len(), 4);
    });
}

#[test]
fn the_recorded_runs_of_10000_agent_runs_are_listed_past_one_grpc_response() {
    let etcd = Etcd::start();
    rt().block_on(async {
        let mut client = Client::connect([&etcd.url], Some(connect_options()))
            .await
            .unwrap();
        // Ten finished runs of 10,000 agents: about 0.5 MB of agents each, 5 MB in all.
        let agents: Vec<serde_json::Value> = (0..10_000)
            .map(|i| serde_json::json!({"name": format!("agent-{i:05}"), "address": format!("10.0.{}.{}:7070", i / 256, i % 256)}))
            .collect();
        for r in 0..10 {
            let id = format!("{r}-big");
            let state = serde_json::json!({"run_id": id, "plan_file": "big.toml", "plan_text": "",
                "status": "completed", "submitted_unix_ms": r, "agents": agents});
            client
                .put(format!("/lockstep/runs/{id}"), serde_json::to_vec(&state).unwrap(), None)
                .await
                .unwrap();
        }
    });
    let o = std::process::Command::new(lockstep_tests::bin("lockstep"))
        .args(["runs", "--json", "--etcd", &etcd.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 10);
    assert_eq!(runs[9]["agents"].as_array().unwrap().len(), 10_000);
}

#[test]
fn lockstep_agents_watch_prints_who_joins_and_who_leaves() {
    use std::io::{BufRead, BufReader};
    let etcd = Etcd::start();
    let rt = rt();
    let client = rt.block_on(async {
        Client::connect([&etcd.url], Some(connect_options()))
            .await
            .unwrap()
    });
    let _guard = rt.enter();
    let Registered(a0, stop_a0) = register(&client, &etcd, "a0", 5);
    rt.block_on(until_listed(&etcd, 1));
    let mut child = std::process::Command::new(lockstep_tests::bin("lockstep"))
        .args(["agents", "--watch", "--etcd", &etcd.url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let _proc = lockstep_tests::Proc(child);
    // Lines through a channel, so a silent watch fails the test after 15 s instead of hanging.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next_line = || {
        rx.recv_timeout(Duration::from_secs(15))
            .expect("a line from lockstep agents --watch within 15 s")
    };
    while next_line() != "1 live agent" {}
    let _a1 = register(&client, &etcd, "a1", 5);
    assert_eq!(next_line(), "+ a1 127.0.0.1:7070");
    stop_a0.send(()).unwrap();
    rt.block_on(a0).unwrap();
    assert_eq!(next_line(), "- a0");
}
