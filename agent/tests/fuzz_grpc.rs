//! Fuzzing the agent's gRPC service: the real daemon (`daemon::serve`) in this process on a
//! real socket (127.0.0.1:0), driven by sequences of calls with arbitrary field values:
//! garbage and generated job text, huge numbers, empty strings, wrong tokens and versions,
//! typed faults with hostile fields (unknown enum values, no kind, NaN, u64::MAX), and calls
//! out of order (start before prepare, prepare twice, abort or
//! attach of unknown runs).
//!
//! Why: the agent runs on production hosts and takes its work from the network, so no request
//! may panic it, wedge it (busy forever) or make it write outside its volumes. The properties,
//! for every case:
//! - each call returns within a bound, Ok or a Status with a non-empty message (a Prepare
//!   refusal is an Ok reply with a non-empty `error`);
//! - after the case, an abort brings the agent back to idle within a bound and it still answers
//!   Hello (the daemon still serves);
//! - no file appears outside the volumes (the test's working directory is watched).
//!
//! Safety of the harness itself: volumes are temp dirs; the process's file-size limit is
//! lowered (RLIMIT_FSIZE, with SIGXFSZ ignored) so a hostile size= fails with EFBIG instead of
//! filling the disk, and its address space (RLIMIT_AS, 8 GiB) so hostile buffers fail to
//! allocate instead of waking the OOM killer; faults that would act on the whole process (kill, pause) or on the host's
//! block devices (kernel_throttle) are never sent, and exec is refused by the agent's config.
//! Counts and buffer sizes are kept to what one test machine can run (numjobs, nrfiles and
//! iodepth are small, bs=1g is left out: a deep queue of 1 GiB buffers is many GiB of memory,
//! and numjobs=65536 is 65,536 threads): their limits are a separate change.
//!
//! For a long run: `PROPTEST_CASES=2000 cargo test -p lockstep-agent --test fuzz_grpc`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockstep_agent::daemon::{self, DaemonConfig, VolumeConfig};
use lockstep_agent::fault::FaultSpec;
use lockstep_proto::PROTOCOL_VERSION;
use lockstep_proto::v1::agent_client::AgentClient;
use lockstep_proto::v1::fault::Kind;
use lockstep_proto::v1::latency_fault::Distribution;
use lockstep_proto::v1::{
    AbortRequest, AttachRequest, ClockProbeRequest, ExponentialDelay, Fault, HelloRequest,
    PrepareRequest, StallFault, StartRequest, UniformDelay, VolumeWork,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

const TOKEN: &str = "fuzz-token";

/// Longest a single call may take (a Prepare lays out at most a few files of at most
/// `FILE_SIZE_LIMIT`).
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// How long an aborted run may take to wind down before the agent counts as wedged.
const IDLE_LIMIT: Duration = Duration::from_secs(30);

/// Largest file this test process may write.
const FILE_SIZE_LIMIT: u64 = 32 << 20;

/// Most address space this test process may have: an agent asked for iodepth x bs buffers of
/// many GiB (bs=1g) got them and the kernel's OOM killer ended the process (and could have
/// picked anyone's); under this limit the allocation fails instead, which the agent reports.
const ADDRESS_SPACE_LIMIT: u64 = 8 << 30;

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}

/// Lowers the file-size and address-space limits of this test process (once): writes beyond
/// the one fail with EFBIG, allocations beyond the other fail.
fn limit_file_size() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain syscalls; SIG_IGN for SIGXFSZ turns the signal into an EFBIG error.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: FILE_SIZE_LIMIT,
                rlim_max: FILE_SIZE_LIMIT,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0, "setrlimit");
            let lim = libc::rlimit {
                rlim_cur: ADDRESS_SPACE_LIMIT,
                rlim_max: ADDRESS_SPACE_LIMIT,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &lim), 0, "setrlimit");
        }
    });
}

/// One agent daemon serving on 127.0.0.1:0, with a directory volume and a file volume.
struct Harness {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Harness {
    fn start() -> Harness {
        limit_file_size();
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("volume dir");
        std::fs::create_dir(data.join("sub")).expect("volume subdir");
        let file = dir.path().join("file.img");
        std::fs::write(&file, vec![0u8; 1 << 20]).expect("file volume");
        let volume = |name: &str, path: PathBuf| VolumeConfig {
            name: name.to_string(),
            path,
            size_bytes: 1 << 30,
            kind: String::new(),
            provisioned_iops: 0,
            provisioned_mib_s: 0,
        };
        let cfg = DaemonConfig {
            name: "fuzz-agent".to_string(),
            labels: BTreeMap::new(),
            volumes: vec![volume("data", data), volume("file", file)],
            token: Some(TOKEN.to_string()),
            grace: Duration::from_secs(2),
            allow_block_devices: false,
            allow_exec: false,
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        rt.spawn(daemon::serve(
            cfg,
            listener,
            None,
            None,
            std::future::pending(),
        ));
        Harness { rt, addr, dir }
    }

    fn volume_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    async fn client(&self) -> AgentClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("the agent accepts connections");
        AgentClient::new(channel).max_decoding_message_size(256 << 20)
    }
}

/// What the cases got to do, printed at the end of a run (`--nocapture`): a fuzz run whose
/// prepares all fail never reaches the run's code.
#[derive(Default)]
struct Tally {
    calls: std::sync::atomic::AtomicUsize,
    refused: std::sync::atomic::AtomicUsize,
    prepared: std::sync::atomic::AtomicUsize,
    started: std::sync::atomic::AtomicUsize,
    events: std::sync::atomic::AtomicUsize,
}

impl Tally {
    fn add(counter: &std::sync::atomic::AtomicUsize) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

static TALLY: Tally = Tally {
    calls: std::sync::atomic::AtomicUsize::new(0),
    refused: std::sync::atomic::AtomicUsize::new(0),
    prepared: std::sync::atomic::AtomicUsize::new(0),
    started: std::sync::atomic::AtomicUsize::new(0),
    events: std::sync::atomic::AtomicUsize::new(0),
};

/// The token a call carries.
#[derive(Debug, Clone)]
enum Token {
    Right,
    Missing,
    Wrong(String),
    /// Not `Bearer <token>` at all.
    Raw(String),
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        12 => Just(Token::Right),
        1 => Just(Token::Missing),
        1 => prop_oneof![
            Just(String::new()),
            Just(format!("{TOKEN} ")),
            Just(TOKEN.to_uppercase()),
            Just(TOKEN[..TOKEN.len() - 1].to_string()),
            "[ -~]{0,40}",
            // Long, but within HTTP/2's usual 16 KiB header limit (a longer one is the client's
            // own protocol error, not the agent's).
            (1usize..8_000).prop_map(|n| "x".repeat(n)),
        ]
        .prop_map(Token::Wrong),
        1 => prop_oneof![Just(TOKEN.to_string()), Just("Bearer".to_string()), "[ -~]{0,30}"]
            .prop_map(Token::Raw),
    ]
}

fn request<T>(msg: T, token: &Token) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(CALL_LIMIT);
    let value = match token {
        Token::Right => Some(format!("Bearer {TOKEN}")),
        Token::Missing => None,
        Token::Wrong(t) => Some(format!("Bearer {t}")),
        Token::Raw(t) => Some(t.clone()),
    };
    // A value that cannot be a header is one the client cannot send: sent without.
    if let Some(v) = value.and_then(|v| v.parse().ok()) {
        req.metadata_mut().insert("authorization", v);
    }
    req
}

fn version() -> impl Strategy<Value = u32> {
    prop_oneof![
        12 => Just(PROTOCOL_VERSION),
        1 => Just(0u32),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
}

fn run_id() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec!["r1", "r1", "r2"]).prop_map(str::to_string),
        1 => prop::sample::select(vec!["", " ", "../../etc", "a/b", "ä🦀", "\u{0}", "r1\n"])
            .prop_map(str::to_string),
        1 => "\\PC{0,20}",
        1 => (1usize..50_000).prop_map(|n| "r".repeat(n)),
    ]
}

/// Job options, with values that are mostly small enough to run (the agent really lays out
/// and runs what it accepts) and sometimes anything.
fn job_line(vol: String) -> impl Strategy<Value = String> {
    let sized = |names: Vec<&'static str>, values: Vec<&'static str>| {
        (prop::sample::select(names), prop::sample::select(values))
            .prop_map(|(n, v)| format!("{n}={v}"))
    };
    let dirs = vec![
        ".".to_string(),
        "sub".to_string(),
        "..".to_string(),
        "/tmp".to_string(),
        vol.clone(),
        format!("{vol}/sub"),
        format!(".:{vol}"),
        format!("sub:{vol}"),
        format!("{vol}/../escape"),
        format!("{vol}:/"),
        String::new(),
    ];
    let files = vec![
        "f.dat".to_string(),
        "sub/f.dat".to_string(),
        "../f.dat".to_string(),
        "/etc/passwd".to_string(),
        format!("{vol}/f.dat"),
        format!("{vol}/../f.dat"),
        "-".to_string(),
        "a\\:b".to_string(),
        String::new(),
    ];
    prop_oneof![
        4 => sized(
            vec!["rw", "readwrite"],
            vec!["read", "write", "randread", "randwrite", "rw", "randrw", "trim", "x", ""],
        ),
        3 => sized(
            vec!["size", "filesize", "io_size", "offset"],
            vec![
                "4k", "64k", "1m", "2m", "0", "1", "50%", "100%", "0%", "101%", "16e",
                "18446744073709551615", "18446744073709551616", "0xFFFFFFFFFFFFFFFF", "1p", "-1",
                "", "1.5m", "64m",
            ],
        ),
        3 => sized(
            vec!["bs", "blocksize", "bssplit"],
            vec![
                "4k", "512", "1", "0", "4k,8k", ",8k", "4k,", "2g", "4294967296", "4k/50:8k/50",
                "4k/100:8k/", "4k/0", "-4k", "16e", "",
            ],
        ),
        3 => sized(
            vec!["ioengine"],
            vec!["null", "null", "psync", "io_uring", "libaio", "sync", "mmap", ""],
        ),
        2 => sized(
            vec!["iodepth", "nrfiles", "iodepth_batch_complete_max", "thinktime_blocks"],
            vec!["1", "2", "4", "16", "0", "-1", "", "x", "1k"],
        ),
        // A clone is a thread with its own buffers and histograms: numjobs=1k is over a GiB
        // of address space, so it stays small here (its bound is the job file's business).
        1 => sized(
            vec!["numjobs"],
            vec!["1", "2", "4", "16", "64", "0", "-1", "", "x"],
        ),
        2 => sized(
            vec!["runtime", "ramp_time", "startdelay", "thinktime", "stuck_timeout"],
            vec![
                "1", "0", "100ms", "1s", "2s", "10m", "1h", "18446744073709551615",
                "18446744073709551615us", "99999999999d", "-1", "",
            ],
        ),
        2 => sized(
            vec!["rate", "rate_iops"],
            vec!["1k", "1", "0", "1m,1m", "18446744073709551615", "1,0", "", "-1"],
        ),
        2 => sized(
            vec![
                "time_based", "direct", "buffered", "verify", "norandommap", "randrepeat",
                "stonewall", "fsync", "fdatasync", "end_fsync", "invalidate", "fixedbufs",
                "registerfiles", "group_reporting",
            ],
            vec!["1", "0", "crc32c", "md5", "", "2", "4294967295"],
        ),
        1 => sized(
            vec!["random_distribution", "rate_process", "percentile_list", "kb_base", "randseed"],
            vec![
                "zipf:1.2", "pareto:0.5", "normal:5", "random", "zipf:0.0000001", "zipf:1e300",
                "pareto:0.9999999", "normal:99.9999", "poisson", "linear", "99:99.9", "1000",
                "18446744073709551615", "",
            ],
        ),
        2 => prop::sample::select(dirs).prop_map(|d| format!("directory={d}")),
        2 => prop::sample::select(files).prop_map(|f| format!("filename={f}")),
        1 => prop::sample::select(vec![
            "name=..", "name=a/b", "name=.", "name=x", "include /etc/passwd", "hipri",
            "exitall", "${HOME}", "bs=${UNSET_FUZZ}", "[", "=", "description=ä",
        ])
        .prop_map(str::to_string),
        1 => "\\PC{0,30}",
    ]
}

fn job_text(vol: String) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (
            prop::collection::vec(
                (
                    prop::sample::select(vec!["[j]", "[global]", "[k]", "[j]"]),
                    prop::collection::vec(job_line(vol), 0..8),
                ),
                1..3,
            ),
            any::<bool>(),
        )
            .prop_map(|(sections, fast)| {
                // Usually a short, cheap run: the agent really runs what it accepts.
                let mut text = if fast {
                    "[global]\nioengine=null\nsize=1m\nruntime=200ms\ntime_based\n".to_string()
                } else {
                    String::new()
                };
                for (header, lines) in sections {
                    text.push_str(header);
                    text.push('\n');
                    for l in lines {
                        text.push_str(&l);
                        text.push('\n');
                    }
                }
                text
            }),
        1 => prop::collection::vec(any::<u8>(), 0..300)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => Just(String::new()),
    ]
}

/// A fault as the coordinator sends it (`lockstep_proto::v1::Fault`): a valid one of a kind
/// that is safe to run in this process, then mutated field by field (hostile numbers, unknown
/// enum values, a missing `kind` or distribution), or one decoded from hostile JSON spec text.
fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        3 => typed_fault(),
        2 => fault_json().prop_map(|json| match serde_json::from_str::<FaultSpec>(&json) {
            Ok(spec) => Fault::from(&spec),
            // Not a spec at all: the message with no kind stands for it.
            Err(_) => Fault::default(),
        }),
    ]
    .prop_map(|f| match &f.kind {
        // Never a fault that stops or kills this very process, or throttles the host's disk.
        Some(Kind::Kill(_) | Kind::Pause(_) | Kind::KernelThrottle(_)) => Fault {
            kind: Some(Kind::Stall(StallFault {})),
            ..f
        },
        _ => f,
    })
}

/// Hostile values for the typed fields of a `Fault`.
#[derive(Debug, Clone)]
enum Edit {
    NoKind,
    AtMs(u64),
    DurationMs(Option<u64>),
    /// Every u64 field of the kind (sizes, caps, IOPS, microseconds).
    Count(Option<u64>),
    /// Every f64 field of the kind (fractions, time scale).
    Real(f64),
    /// Every enum field of the kind (volume type, direction), raw.
    Enum(i32),
    /// A latency fault's distribution replaced or removed.
    Distribution(Option<Distribution>),
}

fn typed_fault() -> impl Strategy<Value = Fault> {
    let templates: Vec<Fault> = [
        r#"{"kind":"stall","at_ms":100,"duration_ms":100}"#,
        r#"{"kind":"latency","at_ms":0,"add_us":1000,"fraction":0.5}"#,
        r#"{"kind":"latency","distribution":{"type":"uniform","min_us":10,"max_us":2000}}"#,
        r#"{"kind":"eio","fraction":0.1,"direction":"write"}"#,
        r#"{"kind":"drop_writes","fraction":0.5}"#,
        r#"{"kind":"iops_cap","total":100}"#,
        r#"{"kind":"bw_cap","read_bytes_per_s":1000000}"#,
        r#"{"kind":"ebs","volume_type":"gp2","size_gib":60,"time_scale":100}"#,
        r#"{"kind":"ebs","volume_type":"io2","size_gib":100,"provisioned_iops":1000}"#,
        r#"{"kind":"cut_off","at_ms":50,"duration_ms":300}"#,
        r#"{"kind":"exec","start":"true"}"#,
    ]
    .iter()
    .map(|j| Fault::from(&serde_json::from_str::<FaultSpec>(j).expect("template")))
    .collect();
    let count = prop_oneof![
        Just(None),
        Just(Some(0u64)),
        Just(Some(u64::MAX)),
        Just(Some(1u64 << 53)),
        any::<u64>().prop_map(Some),
    ];
    let real = prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(0.0),
        Just(1.0000001),
        Just(5e-324),
        Just(1e308),
        any::<f64>(),
    ];
    let edit = prop_oneof![
        1 => Just(Edit::NoKind),
        1 => any::<u64>().prop_map(Edit::AtMs),
        1 => prop_oneof![Just(None), any::<u64>().prop_map(Some)].prop_map(Edit::DurationMs),
        3 => count.prop_map(Edit::Count),
        3 => real.prop_map(Edit::Real),
        2 => prop_oneof![Just(0), Just(1), Just(7), Just(-1), any::<i32>()].prop_map(Edit::Enum),
        1 => prop_oneof![
            Just(None),
            (any::<u64>(), any::<u64>())
                .prop_map(|(min_us, max_us)| Some(Distribution::Uniform(UniformDelay {
                    min_us,
                    max_us
                }))),
            any::<u64>().prop_map(|mean_us| Some(Distribution::Exponential(ExponentialDelay {
                mean_us
            }))),
        ]
        .prop_map(Edit::Distribution),
    ];
    (
        prop::sample::select(templates),
        prop::collection::vec(edit, 0..3),
    )
        .prop_map(|(mut f, edits)| {
            for e in edits {
                apply_edit(&mut f, e);
            }
            f
        })
}

fn apply_edit(f: &mut Fault, e: Edit) {
    match e {
        Edit::NoKind => f.kind = None,
        Edit::AtMs(v) => f.at_ms = v,
        Edit::DurationMs(v) => f.duration_ms = v,
        Edit::Count(v) => match &mut f.kind {
            Some(Kind::IopsCap(c)) => (c.read, c.write, c.total) = (v, v, v),
            Some(Kind::BwCap(c)) => {
                (c.read_bytes_per_s, c.write_bytes_per_s, c.total_bytes_per_s) = (v, v, v)
            }
            Some(Kind::Ebs(e)) => {
                e.size_gib = v.unwrap_or(0);
                (e.provisioned_iops, e.provisioned_mib_s) = (v, v);
            }
            Some(Kind::Latency(l)) => l.add_us = v,
            Some(Kind::Exec(x)) => x.timeout_ms = v,
            _ => {}
        },
        Edit::Real(v) => match &mut f.kind {
            Some(Kind::Ebs(e)) => (e.time_scale, e.initial_credit_fraction) = (v, Some(v)),
            Some(Kind::Latency(l)) => l.fraction = v,
            Some(Kind::Eio(x)) => x.fraction = v,
            Some(Kind::DropWrites(d)) => d.fraction = v,
            _ => {}
        },
        Edit::Enum(v) => match &mut f.kind {
            Some(Kind::Ebs(e)) => e.volume_type = v,
            Some(Kind::Latency(l)) => l.direction = v,
            Some(Kind::Eio(x)) => x.direction = v,
            _ => {}
        },
        Edit::Distribution(d) => {
            if let Some(Kind::Latency(l)) = &mut f.kind {
                l.distribution = d;
            }
        }
    }
}

/// Fault spec text as a plan's table gives it: a valid one, then with fields removed or set
/// to hostile JSON values (what the coordinator's plan parser lets through is what can reach
/// the wire).
fn fault_json() -> impl Strategy<Value = String> {
    let templates = vec![
        r#"{"kind":"stall","at_ms":100,"duration_ms":100}"#,
        r#"{"kind":"latency","at_ms":0,"add_us":1000,"fraction":0.5}"#,
        r#"{"kind":"eio","fraction":0.1,"direction":"write"}"#,
        r#"{"kind":"drop_writes","fraction":0.5}"#,
        r#"{"kind":"iops_cap","total":100}"#,
        r#"{"kind":"bw_cap","read_bytes_per_s":1000000}"#,
        r#"{"kind":"ebs","volume_type":"gp2","size_gib":60,"time_scale":100}"#,
        r#"{"kind":"cut_off","at_ms":50,"duration_ms":300}"#,
        r#"{"kind":"exec","start":"true"}"#,
    ];
    let hostile = prop_oneof![
        Just(serde_json::json!(0)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(u64::MAX)),
        Just(serde_json::json!(i64::MIN)),
        Just(serde_json::json!(1e308)),
        Just(serde_json::json!(-0.0)),
        Just(serde_json::json!(0.5)),
        Just(serde_json::json!(1.0000001)),
        Just(serde_json::json!(5e-324)),
        Just(serde_json::json!(null)),
        Just(serde_json::json!("")),
        Just(serde_json::json!("stall")),
        Just(serde_json::json!("gp3")),
        Just(serde_json::json!("io2")),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
        Just(serde_json::json!(true)),
        any::<u64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>().prop_map(|n| serde_json::json!(n)),
    ];
    let fields = prop::sample::select(vec![
        "kind",
        "at_ms",
        "duration_ms",
        "fraction",
        "add_us",
        "total",
        "read",
        "write",
        "read_bytes_per_s",
        "size_gib",
        "time_scale",
        "volume_type",
        "provisioned_iops",
        "provisioned_mib_s",
        "initial_credit_fraction",
        "direction",
        "distribution",
        "start",
        "end",
        "timeout_ms",
        "fration",
    ]);
    let mutated = (
        prop::sample::select(templates),
        prop::collection::vec((fields, hostile, any::<bool>()), 0..3),
    )
        .prop_map(|(t, edits)| {
            let mut v: serde_json::Value = serde_json::from_str(t).expect("template");
            let obj = v.as_object_mut().expect("object");
            for (field, value, remove) in edits {
                if remove {
                    obj.remove(field);
                } else {
                    obj.insert(field.to_string(), value);
                }
            }
            v.to_string()
        });
    mutated
}

fn overrides() -> impl Strategy<Value = HashMap<String, String>> {
    prop::collection::hash_map(
        prop_oneof![
            prop::sample::select(vec![
                "runtime",
                "size",
                "time_based",
                "ramp_time",
                "iodepth",
                "bs",
                "directory",
                "filename",
                "ioengine",
                "",
            ])
            .prop_map(str::to_string),
            "\\PC{0,10}",
        ],
        prop_oneof![
            prop::sample::select(vec!["1s", "200ms", "1m", "1", "0", "", "..", "/", "null"])
                .prop_map(str::to_string),
            "\\PC{0,10}",
        ],
        0..3,
    )
}

/// A short run that is valid as it starts (null engine, 1 MiB, 200 ms), with up to three
/// hostile options after it: most of these get past Prepare, so their runs really execute.
fn mostly_valid_job_text(vol: String) -> impl Strategy<Value = String> {
    prop::collection::vec(job_line(vol), 0..2).prop_map(|lines| {
        let mut text = "[j]\nioengine=null\nsize=1m\nruntime=200ms\ntime_based\n".to_string();
        for l in lines {
            text.push_str(&l);
            text.push('\n');
        }
        text
    })
}

fn work(vol: String) -> impl Strategy<Value = VolumeWork> {
    work_with(job_text(vol))
}

fn work_with(text: impl Strategy<Value = String>) -> impl Strategy<Value = VolumeWork> {
    (
        prop_oneof![
            6 => Just("data".to_string()),
            2 => Just("file".to_string()),
            1 => prop::sample::select(vec!["", "nope", "DATA", "data "]).prop_map(str::to_string),
        ],
        "\\PC{0,8}",
        text,
        overrides(),
        prop_oneof![
            3 => Just(Vec::new()),
            2 => prop::collection::vec(fault(), 1..4),
        ],
    )
        .prop_map(|(volume, role, jobfile, overrides, faults)| VolumeWork {
            volume,
            role,
            jobfile,
            overrides,
            faults,
            mirror: None,
        })
}

/// One call of a sequence.
#[derive(Debug, Clone)]
enum Call {
    Hello(u32, Token),
    Clock(u32, Token),
    Prepare {
        version: u32,
        token: Token,
        run_id: String,
        work: Vec<VolumeWork>,
        interval_ms: u64,
        keep_files: bool,
        /// Any value: 0, 2 and 3 are accepted, anything else refused naming the field.
        histogram_digits: u32,
    },
    /// `start_at`: milliseconds from now, or an absolute instant in ns.
    Start {
        version: u32,
        token: Token,
        run_id: String,
        start_at: StartAt,
        /// How long to read the event stream before going on (it is dropped after).
        read_ms: u64,
    },
    Abort(u32, Token, String, String),
    Attach(u32, Token, String, u64),
}

#[derive(Debug, Clone)]
enum StartAt {
    FromNowMs(i64),
    Absolute(i64),
}

fn call(vol: String) -> impl Strategy<Value = Call> {
    prop_oneof![
        1 => (version(), token()).prop_map(|(v, t)| Call::Hello(v, t)),
        1 => (version(), token()).prop_map(|(v, t)| Call::Clock(v, t)),
        4 => (
            version(),
            token(),
            run_id(),
            prop::collection::vec(work(vol), 0..3),
            prop_oneof![Just(0u64), Just(1), Just(100), Just(1000), Just(u64::MAX), any::<u64>()],
            any::<bool>(),
            digits(),
        )
            .prop_map(|(version, token, run_id, work, interval_ms, keep_files, histogram_digits)| {
                Call::Prepare {
                    version,
                    token,
                    run_id,
                    work,
                    interval_ms,
                    keep_files,
                    histogram_digits,
                }
            }),
        3 => (
            version(),
            token(),
            run_id(),
            prop_oneof![
                4 => (-2_000i64..500).prop_map(StartAt::FromNowMs),
                1 => prop::sample::select(vec![0, -1, i64::MIN, i64::MAX, 1])
                    .prop_map(StartAt::Absolute),
                1 => any::<i64>().prop_map(StartAt::Absolute),
            ],
            0u64..1500,
        )
            .prop_map(|(version, token, run_id, start_at, read_ms)| Call::Start {
                version,
                token,
                run_id,
                start_at,
                read_ms,
            }),
        2 => (version(), token(), run_id(), "\\PC{0,20}")
            .prop_map(|(v, t, r, why)| Call::Abort(v, t, r, why)),
        1 => (version(), token(), run_id(), any::<u64>())
            .prop_map(|(v, t, r, after)| Call::Attach(v, t, r, after)),
    ]
}

/// `histogram_digits` of a Prepare: mostly the valid ones, and any other value.
fn digits() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => prop::sample::select(vec![0u32, 2, 3]),
        1 => prop::sample::select(vec![1u32, 4, 7, 255, u32::MAX]),
        1 => any::<u32>(),
    ]
}

/// Ok, or a Status that says something.
fn check_status<T>(what: &str, r: Result<T, tonic::Status>) -> Result<Option<T>, TestCaseError> {
    Tally::add(&TALLY.calls);
    match r {
        Ok(v) => Ok(Some(v)),
        Err(s) => {
            Tally::add(&TALLY.refused);
            if std::env::var_os("FUZZ_GRPC_VERBOSE").is_some() {
                eprintln!("{what}: {:?}: {}", s.code(), s.message());
            }
            prop_assert!(
                !s.message().trim().is_empty(),
                "{what}: a Status without a message: {s:?}"
            );
            prop_assert!(
                s.code() != tonic::Code::Internal && s.code() != tonic::Code::Unknown,
                "{what}: {s:?} (a panic or an unexpected failure in the handler)"
            );
            Ok(None)
        }
    }
}

async fn bounded<F: std::future::Future>(what: &str, f: F) -> Result<F::Output, TestCaseError> {
    tokio::time::timeout(CALL_LIMIT, f)
        .await
        .map_err(|_| TestCaseError::fail(format!("{what}: no answer within {CALL_LIMIT:?}")))
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

async fn perform(client: &mut AgentClient<Channel>, call: &Call) -> Result<(), TestCaseError> {
    match call {
        Call::Hello(v, t) => {
            let r = bounded(
                "hello",
                client.hello(request(
                    HelloRequest {
                        protocol_version: *v,
                        coordinator_version: "fuzz".to_string(),
                    },
                    t,
                )),
            )
            .await?;
            check_status("hello", r)?;
        }
        Call::Clock(v, t) => {
            let r = bounded(
                "clock_probe",
                client.clock_probe(request(
                    ClockProbeRequest {
                        protocol_version: *v,
                    },
                    t,
                )),
            )
            .await?;
            check_status("clock_probe", r)?;
        }
        Call::Prepare {
            version,
            token,
            run_id,
            work,
            interval_ms,
            keep_files,
            histogram_digits,
        } => {
            let req = PrepareRequest {
                protocol_version: *version,
                run_id: run_id.clone(),
                work: work.clone(),
                interval_ms: *interval_ms,
                keep_files: *keep_files,
                histogram_digits: *histogram_digits,
            };
            let r = bounded("prepare", client.prepare(request(req, token))).await?;
            if let Some(reply) = check_status("prepare", r)? {
                let reply = reply.into_inner();
                if reply.error.is_empty() {
                    Tally::add(&TALLY.prepared);
                } else if std::env::var_os("FUZZ_GRPC_VERBOSE").is_some() {
                    eprintln!("prepare refused: {}", reply.error);
                }
                // An empty error is "ready"; a refusal must say why (it always has so far, but
                // an error built from an empty message would read as success).
                if !reply.error.is_empty() {
                    prop_assert!(!reply.error.trim().is_empty(), "blank prepare error");
                }
                // Digits it cannot send are refused by name; accepted ones are echoed.
                match *histogram_digits {
                    0 | 2 | 3 if reply.error.is_empty() => {
                        let sends = if *histogram_digits == 0 {
                            3
                        } else {
                            *histogram_digits
                        };
                        prop_assert_eq!(reply.histogram_digits, sends);
                    }
                    0 | 2 | 3 => {}
                    _ => prop_assert!(
                        reply.error.contains("histogram_digits"),
                        "histogram_digits {} accepted or refused for another reason: {:?}",
                        histogram_digits,
                        reply.error
                    ),
                }
            }
        }
        Call::Start {
            version,
            token,
            run_id,
            start_at,
            read_ms,
        } => {
            let at = match start_at {
                StartAt::FromNowMs(ms) => now_ns().saturating_add(ms.saturating_mul(1_000_000)),
                StartAt::Absolute(ns) => *ns,
            };
            let req = StartRequest {
                protocol_version: *version,
                run_id: run_id.clone(),
                start_at_agent_ns: at,
            };
            let r = bounded("start", client.start(request(req, token))).await?;
            if let Some(stream) = check_status("start", r)? {
                Tally::add(&TALLY.started);
                let mut stream = stream.into_inner();
                let until = tokio::time::Instant::now() + Duration::from_millis(*read_ms);
                loop {
                    match tokio::time::timeout_at(until, stream.next()).await {
                        Err(_) | Ok(None) => break,
                        Ok(Some(Ok(_event))) => Tally::add(&TALLY.events),
                        Ok(Some(Err(s))) => {
                            // A cut_off fault breaks the stream with UNAVAILABLE, by design.
                            check_status("start stream", Err::<(), _>(s))?;
                            break;
                        }
                    }
                }
            }
        }
        Call::Abort(v, t, run_id, reason) => {
            let req = AbortRequest {
                protocol_version: *v,
                run_id: run_id.clone(),
                reason: reason.clone(),
            };
            let r = bounded("abort", client.abort(request(req, t))).await?;
            check_status("abort", r)?;
        }
        Call::Attach(v, t, run_id, after) => {
            let req = AttachRequest {
                protocol_version: *v,
                run_id: run_id.clone(),
                after_seq: *after,
            };
            let r = bounded("attach", client.attach(request(req, t))).await?;
            if let Some(stream) = check_status("attach", r)? {
                // Only a look: the stream of a running run does not end by itself.
                let mut stream = stream.into_inner();
                let _ = tokio::time::timeout(Duration::from_millis(50), stream.next()).await;
            }
        }
    }
    Ok(())
}

/// Aborts whatever the agent is doing and waits until it is idle and answering again: an agent
/// that stays busy (or stops answering) after an abort is wedged.
async fn back_to_idle(client: &mut AgentClient<Channel>) -> Result<(), TestCaseError> {
    let deadline = tokio::time::Instant::now() + IDLE_LIMIT;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        let abort = AbortRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: String::new(),
            reason: "fuzz case over".to_string(),
        };
        let hello = HelloRequest {
            protocol_version: PROTOCOL_VERSION,
            coordinator_version: "fuzz".to_string(),
        };
        // A cut_off fault refuses calls (UNAVAILABLE) for its window: wait it out.
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            client.abort(request(abort, &Token::Right)),
        )
        .await;
        match tokio::time::timeout(
            Duration::from_secs(2),
            client.hello(request(hello, &Token::Right)),
        )
        .await
        {
            Ok(Ok(reply)) if reply.get_ref().busy_with_run.is_empty() => return Ok(()),
            Ok(Ok(reply)) => last = format!("busy with run '{}'", reply.get_ref().busy_with_run),
            Ok(Err(s)) => last = format!("hello: {s:?}"),
            Err(_) => last = "hello: no answer".to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(TestCaseError::fail(format!(
        "the agent did not come back to idle within {IDLE_LIMIT:?} of an abort: {last}"
    )))
}

/// Entries of a directory (names only), to see files appear where none may.
fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `cases` sequences of calls against one daemon.
fn fuzz_sequences<S>(default_cases: u32, strategy: impl FnOnce(String) -> S)
where
    S: Strategy<Value = Vec<Call>>,
{
    let h = Harness::start();
    let vol = h.volume_dir().display().to_string();
    // Where an escaping job would put files: the agent's working directory (relative paths)
    // and next to the volume (`..`). Not all of /tmp: other processes write there.
    let outside = [
        std::env::current_dir().expect("cwd"),
        h.dir.path().to_path_buf(),
    ];
    let mut runner = TestRunner::new(Config {
        cases: cases(default_cases),
        max_shrink_iters: 200,
        // Each case is a real agent doing real (small) runs: keep shrinking bounded.
        // A runner made by hand does not know its source file: say where failures go.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/fuzz_grpc.proptest-regressions",
        ))),
        ..Config::default()
    });
    let strategy = strategy(vol);
    // An abort (an allocation failure) or a kill ends the process before proptest can report
    // the case: with FUZZ_GRPC_LOG=FILE each case is written there before it runs.
    let log = std::env::var_os("FUZZ_GRPC_LOG");
    let result = runner.run(&strategy, |sequence| {
        if let Some(path) = &log {
            use std::io::Write;
            let mut f = std::fs::File::create(path).expect("FUZZ_GRPC_LOG");
            writeln!(f, "{sequence:#?}").expect("FUZZ_GRPC_LOG");
        }
        let before: Vec<BTreeSet<String>> = outside.iter().map(|d| entries(d)).collect();
        h.rt.block_on(async {
            let mut client = h.client().await;
            for c in &sequence {
                perform(&mut client, c).await?;
            }
            back_to_idle(&mut client).await
        })?;
        for (dir, before) in outside.iter().zip(&before) {
            let after = entries(dir);
            let new: Vec<&String> = after.difference(before).collect();
            // Only what a job lays out counts (`<job>.<clone>.<file>` or a filename= of this
            // test): other tests and builds write in the working directory too.
            let laid_out: Vec<&&String> = new
                .iter()
                .filter(|n| {
                    let parts: Vec<&str> = n.split('.').collect();
                    n.ends_with(".dat")
                        || parts.len() >= 3
                            && parts[parts.len() - 2..]
                                .iter()
                                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                })
                .collect();
            prop_assert!(
                laid_out.is_empty(),
                "files outside the volume, in {}: {laid_out:?}",
                dir.display()
            );
        }
        Ok(())
    });
    let n = |c: &std::sync::atomic::AtomicUsize| c.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fuzz_grpc: {} calls checked ({} refused with a Status), {} prepares ready, {} runs \
         started, {} run events read (all tests of this binary so far)",
        n(&TALLY.calls),
        n(&TALLY.refused),
        n(&TALLY.prepared),
        n(&TALLY.started),
        n(&TALLY.events),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Mostly single calls: every handler with arbitrary fields, many cases.
#[test]
fn single_calls_with_arbitrary_fields() {
    fuzz_sequences(24, |vol| prop::collection::vec(call(vol), 1..3));
}

/// Sequences of calls in any order: start before prepare, prepare twice, abort and attach of
/// unknown runs, a second prepare while running.
#[test]
fn calls_in_any_order() {
    fuzz_sequences(12, |vol| prop::collection::vec(call(vol), 2..7));
}

/// A prepare and a start of the same run, as a coordinator makes them, with hostile work
/// (job text, overrides, faults), then any calls while it runs: the runs really execute.
#[test]
fn runs_with_hostile_work() {
    fuzz_sequences(8, |vol| {
        (
            prop::collection::vec(
                (
                    prop::sample::select(vec!["data", "file"]),
                    mostly_valid_job_text(vol.clone()),
                    prop_oneof![2 => Just(HashMap::new()), 1 => overrides()],
                    prop::collection::vec(fault(), 0..3),
                )
                    .prop_map(|(volume, jobfile, overrides, faults)| VolumeWork {
                        volume: volume.to_string(),
                        role: "r".to_string(),
                        jobfile,
                        overrides,
                        faults,
                        mirror: None,
                    }),
                1..3,
            ),
            prop_oneof![Just(0u64), Just(100), Just(1000), any::<u64>()],
            -200i64..300,
            0u64..1500,
            prop::collection::vec(call(vol), 0..3),
        )
            .prop_map(|(work, interval_ms, start_ms, read_ms, rest)| {
                let mut calls = vec![
                    Call::Prepare {
                        version: PROTOCOL_VERSION,
                        token: Token::Right,
                        run_id: "r1".to_string(),
                        work,
                        interval_ms,
                        keep_files: false,
                        histogram_digits: 3,
                    },
                    Call::Start {
                        version: PROTOCOL_VERSION,
                        token: Token::Right,
                        run_id: "r1".to_string(),
                        start_at: StartAt::FromNowMs(start_ms),
                        read_ms,
                    },
                ];
                calls.extend(rest);
                calls
            })
    });
}

/// A Prepare asking for interval histograms at digits the agent cannot send (only 2 and 3, or
/// 0 from an older coordinator) is refused naming `histogram_digits`, and nothing is prepared:
/// a valid Prepare of the same agent then succeeds and echoes its digits.
#[test]
fn unsupported_histogram_digits_are_refused_naming_the_field() {
    let h = Harness::start();
    h.rt.block_on(async {
        let mut client = h.client().await;
        let req = |run_id: &str, histogram_digits: u32| PrepareRequest {
            protocol_version: PROTOCOL_VERSION,
            run_id: run_id.to_string(),
            work: vec![VolumeWork {
                volume: "data".to_string(),
                role: "r".to_string(),
                jobfile: "[j]\nioengine=null\nsize=1m\nruntime=100ms\ntime_based\n".to_string(),
                overrides: HashMap::new(),
                faults: Vec::new(),
                mirror: None,
            }],
            interval_ms: 1000,
            keep_files: false,
            histogram_digits,
        };
        for bad in [1, 7, 4, u32::MAX] {
            let reply = client
                .prepare(request(req(&format!("digits-{bad}"), bad), &Token::Right))
                .await
                .expect("a refusal is a reply")
                .into_inner();
            assert!(
                reply.error.contains(&format!("histogram_digits = {bad}")),
                "{bad}: {:?}",
                reply.error
            );
            assert_eq!(reply.histogram_digits, 0);
        }
        for (asked, echoed) in [(2, 2), (3, 3), (0, 3)] {
            let run_id = format!("digits-ok-{asked}");
            let reply = client
                .prepare(request(req(&run_id, asked), &Token::Right))
                .await
                .expect("ready")
                .into_inner();
            assert_eq!((reply.error.as_str(), reply.histogram_digits), ("", echoed));
            client
                .abort(request(
                    AbortRequest {
                        protocol_version: PROTOCOL_VERSION,
                        run_id,
                        reason: "test".into(),
                    },
                    &Token::Right,
                ))
                .await
                .expect("abort");
        }
    });
}

/// The typed fault on the wire is validated on receipt: a malformed one is refused at Prepare
/// with the volume, the fault's position and the field named, and nothing is prepared.
#[test]
fn malformed_faults_are_refused_naming_the_field() {
    let h = Harness::start();
    let valid = Fault::from(
        &serde_json::from_str::<FaultSpec>(r#"{"kind":"stall","at_ms":10,"duration_ms":10}"#)
            .expect("spec"),
    );
    let bad_type = Fault::from(
        &serde_json::from_str::<FaultSpec>(r#"{"kind":"ebs","volume_type":"gp2","size_gib":60}"#)
            .expect("spec"),
    );
    let mut bad_type = bad_type;
    if let Some(Kind::Ebs(e)) = &mut bad_type.kind {
        e.volume_type = 42;
    }
    let cases = [
        (Fault::default(), "fault 2 (?): kind is missing"),
        (bad_type, "fault 2 (ebs): volume_type is 42"),
        (
            Fault {
                kind: Some(Kind::DropWrites(lockstep_proto::v1::DropWritesFault {
                    fraction: f64::NAN,
                })),
                ..Fault::default()
            },
            "fault 2 (drop_writes): fraction",
        ),
    ];
    h.rt.block_on(async {
        let mut client = h.client().await;
        for (i, (bad, expected)) in cases.into_iter().enumerate() {
            let req = PrepareRequest {
                protocol_version: PROTOCOL_VERSION,
                run_id: format!("bad-fault-{i}"),
                work: vec![VolumeWork {
                    volume: "data".to_string(),
                    role: "r".to_string(),
                    jobfile: "[j]\nioengine=null\nsize=1m\nruntime=100ms\ntime_based\n".to_string(),
                    overrides: HashMap::new(),
                    faults: vec![valid.clone(), bad],
                    mirror: None,
                }],
                interval_ms: 1000,
                keep_files: false,
                histogram_digits: 0,
            };
            let reply = client
                .prepare(request(req, &Token::Right))
                .await
                .expect("a refusal is a reply")
                .into_inner();
            assert!(
                reply
                    .error
                    .starts_with(&format!("volume 'data': {expected}")),
                "{expected:?} in {:?}",
                reply.error
            );
        }
    });
}
