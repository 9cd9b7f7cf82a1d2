//! A routed `rlm flow run` against a plain graph of the same steps, as a user runs it: the
//! whole process's peak RSS and time.
//!
//! ```text
//! cargo bench -p rlm-benches --bench routed_run              # 250 and 1 000 steps, 5 rounds
//! cargo bench -p rlm-benches --bench routed_run -- --quick   # 2 rounds (or RLM_BENCH_QUICK=1)
//! cargo bench -p rlm-benches --bench routed_run -- --rounds 3
//! cargo bench -p rlm-benches --bench routed_run -- --steps 1000,4000   # other run lengths
//! ```
//!
//! `--bench routed` measures the engine's state heap alone, in-process; this bench measures
//! what issue 29 measured: a whole run of the release `rlm` binary (build it first: `cargo
//! build --release -p rlm-cli --bin rlm`; `RLM_BIN=PATH` measures another binary instead). A
//! generated workflow of N node steps has two `PythonAgent` steps, `a` and `b`, that hand work
//! back and forth until the step count reaches N; each step appends one message `{author,
//! content, topic}` to `messages` and counts the steps in `steps` (the writes of an agent
//! under a router, made the same way in both graphs). The **routed** workflow is a
//! `RouterAgent` in active mode (every transition through the router: a decision record
//! appended to `decisions` after every node, committed with the node's checkpoint); the
//! **plain** workflow is a `GraphAgent` with the same nodes joined by plain edges. Each runs
//! as `rlm flow run` runs any workflow — every node checkpointed to an SQLite run database —
//! and again with the JSONL event log (`--events`). There is no in-memory `rlm flow run`:
//! every run is durable. Each run's final state (`--state`) is checked: N steps, N messages,
//! and N decisions under the router, none without.
//!
//! Per child process, from `wait4`'s resource usage: its peak RSS (`ru_maxrss`) and CPU time,
//! and its wall time. Routed and plain runs alternate (routed, plain, then plain, routed in
//! the next round …), so a load that drifts favours neither; reported are the medians over
//! the rounds, the ratio routed / plain of the medians, and the range of each round's ratio,
//! with the machine's load average before and after. Target (issue 29 §1): a 1 000-step
//! routed run within 2× the memory and time of the plain graph.
//!
//! Before and after a change, in one run: `RLM_BASE_BIN=PATH` (a copy of the `rlm` binary
//! built before it) is measured in the same rounds, its runs alternated with the head's
//! (base routed, base plain, head routed, head plain, then the reverse).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use rlm_benches::median;
use serde_json::Value;

/// The two node steps: each appends a message and counts the steps; the last sets `done`.
const STEPS_PY: &str = r#"def step(ctx, name, steps):
    n = ctx.state.get("steps", 0) + 1
    ctx.state["messages"].append({
        "author": name,
        "content": f"Step {n}: reviewed the previous work and handed it on.",
        "topic": f"story-{n}",
    })
    ctx.state["steps"] = n
    if n >= steps:
        ctx.state["done"] = True
"#;

/// Which graph joins the steps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Routed,
    Plain,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Routed => "routed",
            Self::Plain => "plain",
        }
    }
}

/// What a run writes beside its checkpoints.
#[derive(Clone, Copy)]
enum Sinks {
    /// `rlm flow run` as it runs by default: SQLite checkpoints only.
    Checkpoints,
    /// And the JSONL event log (`--events`).
    EventLog,
}

impl Sinks {
    fn name(self) -> &'static str {
        match self {
            Self::Checkpoints => "SQLite",
            Self::EventLog => "SQLite + event log",
        }
    }
}

/// One child's figures.
#[derive(Clone, Copy)]
struct Sample {
    wall_s: f64,
    cpu_s: f64,
    rss_mb: f64,
}

/// Writes the two workflows of `steps` node steps and their step file into `dir`.
fn write_workflows(dir: &Path, steps: u64) -> anyhow::Result<()> {
    std::fs::write(dir.join("steps.py"), STEPS_PY)?;
    for name in ["a", "b"] {
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            format!(
                "agent_class: PythonAgent\nname: {name}\nfunction: steps.py:step\n\
                 args: {{name: {name}, steps: {steps}}}\n"
            ),
        )?;
    }
    // Both allow far more steps than they take: the step count ends them, not a limit.
    let max_steps = steps * 4;
    std::fs::write(
        dir.join("routed.yaml"),
        format!(
            "agent_class: RouterAgent\nname: routed\nmode: active\nstart: a\n\
             max_steps: {max_steps}\nsub_agents:\n  - config_path: a.yaml\n  \
             - config_path: b.yaml\nsuccessors:\n  a: b\n  b:\n    \
             - {{when: {{key: done, truthy: true}}, to: END}}\n    - {{to: a}}\n"
        ),
    )?;
    std::fs::write(
        dir.join("plain.yaml"),
        format!(
            "agent_class: GraphAgent\nname: plain\nstart: a\nmax_steps: {max_steps}\n\
             edges:\n  - {{from: a, to: b}}\n  \
             - {{from: b, to: END, when: {{key: done, truthy: true}}}}\n  - {{from: b, to: a}}\n\
             sub_agents:\n  - config_path: a.yaml\n  - config_path: b.yaml\n"
        ),
    )?;
    Ok(())
}

/// The `rlm` binary to measure: `RLM_BIN`, or the workspace's release build (`cargo bench`
/// holds the target folder's lock while a bench runs, so it cannot build it from here).
fn rlm_binary() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("RLM_BIN") {
        Some(path) => PathBuf::from(path),
        None => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .context("The benches crate has no parent folder")?;
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target"))
                .join("release")
                .join("rlm")
        }
    };
    ensure!(
        path.is_file(),
        "No `rlm` binary at {}: build it first with `cargo build --release -p rlm-cli --bin \
         rlm` (or name one with `RLM_BIN=PATH`)",
        path.display()
    );
    // A binary older than this bench is likely older than the workspace's sources.
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(rlm), Some(bench)) = (
        modified(&path),
        std::env::current_exe().ok().and_then(|p| modified(&p)),
    ) && rlm < bench
    {
        println!(
            "warning: {} is older than this bench: run `cargo build --release -p rlm-cli --bin \
             rlm` if the workspace changed since",
            path.display()
        );
    }
    Ok(path)
}

/// Runs `rlm flow run` once and measures the child from `wait4`.
fn run_once(
    rlm: &Path,
    dir: &Path,
    kind: Kind,
    sinks: Sinks,
    steps: u64,
    index: usize,
) -> anyhow::Result<Sample> {
    let db = dir.join(format!("run-{index}.db"));
    let state = dir.join(format!("state-{index}.json"));
    let mut cmd = Command::new(rlm);
    cmd.current_dir(dir)
        .args(["flow", "run", &format!("{}.yaml", kind.name()), "--quiet"])
        .args(["--input", "messages:=[]", "--db"])
        .arg(&db)
        .arg("--state")
        .arg(&state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Sinks::EventLog = sinks {
        cmd.arg("--events")
            .arg(dir.join(format!("events-{index}.jsonl")));
    }
    let start = Instant::now();
    let mut child = cmd.spawn().context("Could not start `rlm flow run`")?;
    let stderr = child.stderr.take();
    // Read stderr on a thread, so that a chatty child never blocks on a full pipe.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = stderr {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        }
        text
    });
    let pid = libc::pid_t::try_from(child.id()).context("A child's pid out of range")?;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet waited for; both pointers are to live locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_s = start.elapsed().as_secs_f64();
    ensure!(
        waited == pid,
        "wait4 failed: {}",
        std::io::Error::last_os_error()
    );
    let stderr = reader.join().unwrap_or_default();
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!(
            "`rlm flow run {}.yaml` failed (wait status {status}):\n{stderr}",
            kind.name()
        );
    }
    check_state(&state, kind, steps)?;
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let sample = Sample {
        wall_s,
        cpu_s: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        // Linux reports `ru_maxrss` in KiB.
        rss_mb: usage.ru_maxrss as f64 / 1024.0,
    };
    // The child's files are not needed again: the next run starts from none.
    for path in [db, state, dir.join(format!("events-{index}.jsonl"))] {
        let _ = std::fs::remove_file(path);
    }
    Ok(sample)
}

/// The run did its `steps` steps: that many messages, and decisions under the router only.
fn check_state(path: &Path, kind: Kind, steps: u64) -> anyhow::Result<()> {
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(path)
            .with_context(|| format!("No state at {}", path.display()))?,
    )?;
    let count = |key: &str| state.get(key).and_then(Value::as_array).map_or(0, Vec::len);
    let decisions = if kind == Kind::Routed { steps } else { 0 };
    ensure!(
        state.get("steps").and_then(Value::as_u64) == Some(steps)
            && count("messages") as u64 == steps
            && count("decisions") as u64 == decisions,
        "The {} run of {steps} steps ended with steps {:?}, {} messages, {} decisions",
        kind.name(),
        state.get("steps"),
        count("messages"),
        count("decisions")
    );
    Ok(())
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// `routed / plain` of the medians, and the range of the rounds' own ratios.
fn ratio(routed: &[f64], plain: &[f64]) -> String {
    let mut rounds: Vec<f64> = routed.iter().zip(plain).map(|(r, p)| r / p).collect();
    rounds.sort_by(f64::total_cmp);
    let of_medians = median(routed.to_vec()) / median(plain.to_vec());
    match (rounds.first(), rounds.last()) {
        (Some(lo), Some(hi)) => format!("{of_medians:.2}x ({lo:.2}-{hi:.2}x)"),
        _ => "-".into(),
    }
}

fn main() -> anyhow::Result<()> {
    let quick =
        std::env::args().any(|a| a == "--quick") || std::env::var_os("RLM_BENCH_QUICK").is_some();
    let args: Vec<String> = std::env::args().collect();
    let rounds = match args.iter().position(|a| a == "--rounds") {
        Some(i) => args
            .get(i + 1)
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .context("`--rounds` takes a number of rounds, at least 1")?,
        None if quick => 2,
        None => 5,
    };
    let lengths: Vec<u64> = match args.iter().position(|a| a == "--steps") {
        Some(i) => args
            .get(i + 1)
            .map(|list| {
                list.split(',')
                    .map(|n| n.trim().parse::<u64>().ok().filter(|&n| n > 0))
                    .collect::<Option<Vec<_>>>()
            })
            .and_then(|lengths| lengths.filter(|l| !l.is_empty()))
            .context("`--steps` takes run lengths in node steps, such as `250,1000`")?,
        None => vec![250, 1_000],
    };
    let mut builds = vec![("head", rlm_binary()?)];
    if let Some(base) = std::env::var_os("RLM_BASE_BIN") {
        let base = PathBuf::from(base);
        ensure!(
            base.is_file(),
            "No `rlm` binary at {} (`RLM_BASE_BIN`)",
            base.display()
        );
        builds.insert(0, ("base", base));
    }
    println!(
        "routed_run: `rlm flow run` of N node steps, routed vs plain, {rounds} rounds alternated; load {}",
        load()
    );
    for (name, path) in &builds {
        println!("  {name}: {}", path.display());
    }
    println!(
        "{:<6} {:<19} {:<5} {:<7} {:>8} {:>8} {:>9}   routed / plain: wall, CPU, peak RSS",
        "steps", "sinks", "build", "graph", "wall s", "CPU s", "RSS MB"
    );
    // Every run of a round, in order: each build's routed and plain run.
    let runs: Vec<(usize, Kind)> = (0..builds.len())
        .flat_map(|b| [(b, Kind::Routed), (b, Kind::Plain)])
        .collect();
    let mut index = 0;
    for steps in lengths {
        let dir = tempfile::tempdir()?;
        write_workflows(dir.path(), steps)?;
        for sinks in [Sinks::Checkpoints, Sinks::EventLog] {
            // samples[build][kind]
            let mut samples = vec![[Vec::new(), Vec::new()]; builds.len()];
            for round in 0..rounds {
                // Each run goes first in turn: routed, plain (, base, head), then the reverse,
                // so a load that drifts favours none of them.
                let mut order = runs.clone();
                if round % 2 == 1 {
                    order.reverse();
                }
                for (build, kind) in order {
                    index += 1;
                    let sample = run_once(&builds[build].1, dir.path(), kind, sinks, steps, index)?;
                    samples[build][usize::from(kind == Kind::Plain)].push(sample);
                }
            }
            for (build, [routed, plain]) in samples.iter().enumerate() {
                report(steps, sinks, builds[build].0, routed, plain);
            }
        }
    }
    println!("load after: {}", load());
    println!("target: a 1 000-step routed run within 2x the memory and time of the plain graph");
    Ok(())
}

/// One build's two rows: medians, and the ratios on the routed row.
fn report(steps: u64, sinks: Sinks, build: &str, routed: &[Sample], plain: &[Sample]) {
    let column =
        |samples: &[Sample], f: fn(&Sample) -> f64| -> Vec<f64> { samples.iter().map(f).collect() };
    for (kind, samples) in [(Kind::Routed, routed), (Kind::Plain, plain)] {
        let line = format!(
            "{steps:<6} {:<19} {build:<5} {:<7} {:>8.3} {:>8.3} {:>9.1}",
            sinks.name(),
            kind.name(),
            median(column(samples, |s| s.wall_s)),
            median(column(samples, |s| s.cpu_s)),
            median(column(samples, |s| s.rss_mb)),
        );
        if kind == Kind::Routed {
            println!(
                "{line}   {}, {}, {}",
                ratio(&column(routed, |s| s.wall_s), &column(plain, |s| s.wall_s)),
                ratio(&column(routed, |s| s.cpu_s), &column(plain, |s| s.cpu_s)),
                ratio(&column(routed, |s| s.rss_mb), &column(plain, |s| s.rss_mb)),
            );
        } else {
            println!("{line}");
        }
    }
}
