//! REPL benchmarks: `llm_query` overhead against a raw bridge call, `llm_query_batched`
//! fan-out, the cost of an isolated session (a worker process) against the in-process one
//! measured in the same run — start-up, a block's round trip, a sub-call's round trip through
//! the parent, a context handed over in shared memory, the restore after a crash — and
//! context load time / peak RSS.
//!
//! `cargo bench -p rlm-benches --bench repl [-- --quick]`
//!
//! Loads run in a child process each (this binary re-executed with `--load-child`), so the
//! peak RSS (`VmHWM`) of one load is not hidden by an earlier one. Isolated sessions run this
//! binary again as their worker (`__worker`).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use kernel::repl::{ContextSource, ReplSession, SessionConfig};
use rlm_benches::{generate_text, status_kib};

fn main() -> anyhow::Result<()> {
    rlm_benches::serve_as_worker();
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--load-child") {
        return load_child(args.get(i + 1).map(PathBuf::from));
    }
    let quick = args.iter().any(|a| a == "--quick");
    println!("# repl benchmarks{}", if quick { " (--quick)" } else { "" });
    sub_calls::run(quick)?;
    isolation::run(quick)?;
    loads(quick)?;
    Ok(())
}

fn no_endpoints() -> Arc<kernel::repl::Endpoints> {
    Arc::new(
        kernel::repl::Endpoints::new(
            Vec::new(),
            Arc::new(bridge::Ledger::new(bridge::Budget::default())),
        )
        .expect("an empty registry is valid"),
    )
}

/// Child: start the interpreter (and polars), then load one context; print one JSON line.
fn load_child(path: Option<PathBuf>) -> anyhow::Result<()> {
    let path = path.ok_or_else(|| anyhow::anyhow!("--load-child needs a path"))?;
    let warm = ReplSession::new(SessionConfig::default(), no_endpoints(), &[])?;
    warm.exec("import polars, json")?;
    let baseline_kib = status_kib("VmRSS:");
    let started = Instant::now();
    let session = ReplSession::new(
        SessionConfig::default(),
        no_endpoints(),
        &[ContextSource::Path(path)],
    )?;
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let meta = &session.contexts()[0];
    println!(
        "{}",
        serde_json::json!({
            "load_ms": meta.load_ms,
            "wall_ms": wall_ms,
            "baseline_kib": baseline_kib,
            "hwm_kib": status_kib("VmHWM:"),
            "rss_kib": status_kib("VmRSS:"),
            "rows": meta.rows,
            "chars": meta.chars,
        })
    );
    Ok(())
}

fn generate_csv(path: &Path, target_bytes: u64) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let header = "id,service,level,latency_ms,message\n";
    out.write_all(header.as_bytes())?;
    let mut written = header.len() as u64;
    let services = ["auth", "billing", "search", "checkout", "profile"];
    let levels = ["INFO", "WARN", "ERROR"];
    let mut i: u64 = 0;
    while written < target_bytes {
        let line = format!(
            "{i},{},{},{}.{},request {} handled by worker {}\n",
            services[(i % 5) as usize],
            levels[(i % 7 % 3) as usize],
            i % 997,
            i % 10,
            i.wrapping_mul(2_654_435_761) % 1_000_000,
            i % 64
        );
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
        i += 1;
    }
    out.flush()?;
    Ok(())
}

fn generate_json(path: &Path, target_bytes: u64) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    out.write_all(b"[")?;
    let mut written = 1u64;
    let mut i: u64 = 0;
    while written < target_bytes {
        let item = format!(
            "{}{{\"id\": {i}, \"user\": \"u{}\", \"tags\": [\"a\", \"b\"], \"text\": \"message number {i} about topic {}\"}}",
            if i == 0 { "" } else { ",\n" },
            i % 1000,
            i % 17
        );
        out.write_all(item.as_bytes())?;
        written += item.len() as u64;
        i += 1;
    }
    out.write_all(b"]\n")?;
    out.flush()?;
    Ok(())
}

fn loads(quick: bool) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("rlm-repl-bench")
        .tempdir()?;
    let mb = 1u64 << 20;
    let (csv_size, text_size, json_size) = if quick {
        (64 * mb, 8 * mb, 16 * mb)
    } else {
        (1024 * mb, 50 * mb, 200 * mb)
    };
    let cases = [
        (
            "CSV → polars.DataFrame",
            dir.path().join("big.csv"),
            csv_size,
            generate_csv as fn(&Path, u64) -> anyhow::Result<()>,
        ),
        (
            "text → str",
            dir.path().join("big.txt"),
            text_size,
            generate_text,
        ),
        (
            "JSON → list",
            dir.path().join("big.json"),
            json_size,
            generate_json,
        ),
    ];
    println!();
    println!(
        "## context loads (one child process each; RSS above an interpreter with polars imported)"
    );
    println!(
        "| context | file MB | load ms | MB/s | peak RSS MB | peak extra / file | extra after load / file |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let exe = std::env::current_exe()?;
    for (label, path, size, generate) in cases {
        generate(&path, size)?;
        let file_bytes = std::fs::metadata(&path)?.len();
        let output = Command::new(&exe).arg("--load-child").arg(&path).output()?;
        anyhow::ensure!(
            output.status.success(),
            "load child failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = String::from_utf8_lossy(&output.stdout);
        let report: serde_json::Value = serde_json::from_str(line.trim())?;
        let load_ms = report["load_ms"].as_f64().unwrap_or(f64::NAN);
        let hwm = report["hwm_kib"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let base = report["baseline_kib"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let after = report["rss_kib"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let file_mb = file_bytes as f64 / mb as f64;
        println!(
            "| {label} | {file_mb:.0} | {load_ms:.0} | {:.0} | {hwm:.0} | {:.2}× | {:.2}× |",
            file_mb / (load_ms / 1000.0),
            (hwm - base) / file_mb,
            (after - base) / file_mb
        );
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

mod sub_calls {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bridge::mock::{Latency, MockConfig, MockServer};
    use bridge::{
        BatchPolicy, Budget, CallOptions, ChatRequest, EndpointConfig, Endpoints, Ledger,
    };
    use kernel::repl::{Isolation, ReplSession, SessionConfig};
    use kernel::runtime;

    pub(super) fn endpoints(server: &MockServer) -> anyhow::Result<Arc<Endpoints>> {
        let config = EndpointConfig::openai("sub", server.openai_base_url(), "sub-model");
        Ok(Arc::new(Endpoints::new(
            vec![config],
            Arc::new(Ledger::new(Budget::default())),
        )?))
    }

    fn session(endpoints: &Arc<Endpoints>) -> anyhow::Result<ReplSession> {
        session_in(endpoints, Isolation::None)
    }

    pub(super) fn session_in(
        endpoints: &Arc<Endpoints>,
        isolation: Isolation,
    ) -> anyhow::Result<ReplSession> {
        let config = SessionConfig {
            cell_timeout: Duration::from_secs(600),
            isolation,
            ..SessionConfig::default()
        };
        Ok(ReplSession::new(config, Arc::clone(endpoints), &[])?)
    }

    pub(super) fn exec_ok(session: &ReplSession, code: &str) -> anyhow::Result<Duration> {
        let result = session.exec(code)?;
        anyhow::ensure!(result.error.is_none(), "block failed: {}", result.stderr);
        Ok(result.duration)
    }

    pub(super) fn run(quick: bool) -> anyhow::Result<()> {
        let rt = runtime::shared();
        let n: u32 = if quick { 300 } else { 3000 };
        let rounds = if quick { 2 } else { 5 };

        // Sequential calls at 0 ms latency: bridge call vs llm_query from Python.
        let server = rt.block_on(MockServer::start(MockConfig::default()))?;
        let eps = endpoints(&server)?;
        let endpoint = eps.get("sub")?;
        let s = session(&eps)?;
        let raw_call = || -> anyhow::Result<Duration> {
            let started = Instant::now();
            for i in 0..n {
                rt.block_on(endpoint.call(
                    ChatRequest::from_prompt(format!("prompt {i}")),
                    &CallOptions::default(),
                ))?;
            }
            Ok(started.elapsed() / n)
        };
        let isolated = session_in(&eps, Isolation::Process)?;
        let code = format!("for i in range({n}):\n    llm_query(f'prompt {{i}}')");
        raw_call()?; // warm up connections and code paths
        exec_ok(&s, &code)?;
        exec_ok(&isolated, &code)?;
        let (mut raw, mut native, mut remote) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            raw.push(raw_call()?);
            native.push(exec_ok(&s, &code)? / n);
            remote.push(exec_ok(&isolated, &code)? / n);
        }
        let raw = median(raw);
        let native = median(native);
        let remote = median(remote);
        println!();
        println!(
            "## sequential sub-calls at 0 ms mock latency ({n} calls, median of {rounds} rounds)"
        );
        println!("| path | per call | overhead vs bridge |");
        println!("|---|---:|---:|");
        println!(
            "| bridge `Endpoint::call` (block_on from a plain thread) | {} | — |",
            ms(raw)
        );
        println!(
            "| `llm_query` from Python | {} | {:+.3} ms |",
            ms(native),
            (native.as_secs_f64() - raw.as_secs_f64()) * 1000.0
        );
        println!(
            "| `llm_query` from an isolated session (through the parent) | {} | {:+.3} ms ({:+.3} ms vs in-process) |",
            ms(remote),
            (remote.as_secs_f64() - raw.as_secs_f64()) * 1000.0,
            (remote.as_secs_f64() - native.as_secs_f64()) * 1000.0
        );
        drop(isolated);
        drop(s);
        rt.block_on(server.shutdown());

        // Batched fan-out of 1000 prompts at 50 ms latency.
        let k = 1000;
        let latency = Latency::fixed(Duration::from_millis(50));
        let server = rt.block_on(MockServer::start(MockConfig {
            latency,
            ..MockConfig::default()
        }))?;
        let eps = endpoints(&server)?;
        let endpoint = eps.get("sub")?;
        let s = session(&eps)?;
        let bridge_batch = || -> Duration {
            let requests = (0..k)
                .map(|i| ChatRequest::from_prompt(format!("item {i}")))
                .collect();
            let started = Instant::now();
            let out =
                rt.block_on(endpoint.batch(requests, BatchPolicy::default(), &Default::default()));
            assert_eq!(out.len(), k);
            started.elapsed()
        };
        let code = format!(
            "r = llm_query_batched([f'item {{i}}' for i in range({k})])\nassert len(r) == {k} and r[7] == 'item 7', r[7]"
        );
        bridge_batch();
        let (mut raw, mut native) = (Vec::new(), Vec::new());
        for _ in 0..rounds.min(3) {
            raw.push(bridge_batch());
            native.push(exec_ok(&s, &code)?);
        }
        let raw = median(raw);
        let native = median(native);
        println!();
        println!("## llm_query_batched of {k} prompts at 50 ms mock latency (max_in_flight 128)");
        println!("| path | wall time | ratio |");
        println!("|---|---:|---:|");
        println!("| bridge `Endpoint::batch` | {} | 1.00× |", ms(raw));
        println!(
            "| `llm_query_batched` from Python | {} | {:.2}× |",
            ms(native),
            native.as_secs_f64() / raw.as_secs_f64()
        );
        drop(s);
        rt.block_on(server.shutdown());
        Ok(())
    }

    pub(super) fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }

    pub(super) fn ms(d: Duration) -> String {
        format!("{:.3} ms", d.as_secs_f64() * 1000.0)
    }
}

/// What an isolated session costs against the in-process one, measured in the same run:
/// start-up, a block's round trip, a 50 MB context handed over in shared memory, the restore
/// after a crash.
mod isolation {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bridge::mock::{MockConfig, MockServer};
    use kernel::repl::{ContextSource, Isolation, ReplSession, SessionConfig};
    use kernel::runtime;

    use super::sub_calls::{endpoints, exec_ok, median, ms, session_in};

    pub(super) fn run(quick: bool) -> anyhow::Result<()> {
        let rt = runtime::shared();
        let server = rt.block_on(MockServer::start(MockConfig::default()))?;
        let eps = endpoints(&server)?;
        let rounds = if quick { 5 } else { 15 };

        // Start-up: a new session and its first block. The in-process interpreter is warm
        // (started by the earlier sections); a worker is forked from the worker template, or
        // (templates off, the way before) takes the spare prepared after the last one was
        // ready, as in a long-lived process (eval, notebooks, a restart). Alternated.
        let start = |isolation, template: bool| -> anyhow::Result<Duration> {
            kernel::repl::use_worker_template(template);
            let started = Instant::now();
            let s = session_in(&eps, isolation)?;
            exec_ok(&s, "pass")?;
            Ok(started.elapsed())
        };
        let cold = start(Isolation::Process, true)?;
        let (mut local, mut forked, mut spare) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            local.push(start(Isolation::None, true)?);
            for template in [round % 2 == 0, round % 2 == 1] {
                // Let the spare's (or the template's) interpreter start, as it does between
                // sessions.
                std::thread::sleep(Duration::from_millis(300));
                let took = start(Isolation::Process, template)?;
                if template { &mut forked } else { &mut spare }.push(took);
            }
        }
        kernel::repl::use_worker_template(true);
        let (local, forked, spare) = (median(local), median(forked), median(spare));
        println!();
        println!(
            "## isolated sessions (a worker process) against in-process, same run (median of {rounds})"
        );
        println!("| what | in-process | isolated | added |");
        println!("|---|---:|---:|---:|");
        for (how, isolated) in [
            ("forked from the worker template", forked),
            ("a spare worker, no template", spare),
        ] {
            println!(
                "| start a session + first block (isolated: {how}) | {} | {} | {:+.1} ms |",
                ms(local),
                ms(isolated),
                (isolated.as_secs_f64() - local.as_secs_f64()) * 1000.0
            );
        }
        println!(
            "| start a session + first block right after the last one closed (no wait) | — | {} | — |",
            ms(cold)
        );

        // A block's round trip: an almost empty block and its reply (output, variables).
        // Only a block that may start a process (one about to, per the audit hook) lists this
        // process's children in `/proc`, before its first such call and after it ends; the
        // baseline block raises the audit event of `os.fork`, so it pays both scans (every
        // block once did); the other raises an event of no interest. A block that does start
        // a process (`true`, in-process) says what the scans weigh beside the start itself.
        // Alternated.
        let n = if quick { 200 } else { 1000 };
        let local_s = session_in(&eps, Isolation::None)?;
        let isolated_s = session_in(&eps, Isolation::Process)?;
        const QUIET: &str = "__import__('sys').audit('rlm.bench')";
        const SCANNED: &str = "__import__('sys').audit('os.fork')";
        const STARTS: &str = "__import__('subprocess').run(['true'])";
        let trip = |s: &ReplSession, code: &str, n: usize| -> anyhow::Result<Duration> {
            let started = Instant::now();
            for _ in 0..n {
                exec_ok(s, code)?;
            }
            Ok(started.elapsed() / u32::try_from(n)?)
        };
        let mut times: [Vec<Duration>; 5] = Default::default();
        for round in 0..=rounds.min(5) {
            let trips = [
                trip(&local_s, SCANNED, n)?,
                trip(&local_s, QUIET, n)?,
                trip(&isolated_s, SCANNED, n)?,
                trip(&isolated_s, QUIET, n)?,
                trip(&local_s, STARTS, n / 10)?,
            ];
            // The first round warms up.
            if round > 0 {
                for (all, one) in times.iter_mut().zip(trips) {
                    all.push(one);
                }
            }
        }
        let [local_scanned, local, isolated_scanned, isolated, starts] = times.map(median);
        println!(
            "| one block and its result, {n} in a row (one that may start a process: `/proc` scanned twice) | {} | {} | {:+.3} ms |",
            ms(local_scanned),
            ms(isolated_scanned),
            (isolated_scanned.as_secs_f64() - local_scanned.as_secs_f64()) * 1000.0
        );
        println!(
            "| one block and its result, {n} in a row (one that starts no process: no scan) | {} | {} | {:+.3} ms |",
            ms(local),
            ms(isolated),
            (isolated.as_secs_f64() - local.as_secs_f64()) * 1000.0
        );
        println!(
            "|   no scan / scanned | {:.2}× | {:.2}× | |",
            local.as_secs_f64() / local_scanned.as_secs_f64(),
            isolated.as_secs_f64() / isolated_scanned.as_secs_f64()
        );
        println!(
            "| one block that runs `true` in a subprocess, {} in a row (scans included: {:.0}% of it) | {} | — | — |",
            n / 10,
            100.0 * (local_scanned.as_secs_f64() - local.as_secs_f64()) / starts.as_secs_f64(),
            ms(starts)
        );

        // A context given as text: one copy into Python in-process; a memfd written by the
        // parent and mapped by the worker.
        let mb = if quick { 10 } else { 50 };
        let text = "log line with some words in it\n".repeat(mb * (1 << 20) / 31);
        let load = |isolation| -> anyhow::Result<Duration> {
            let config = SessionConfig {
                isolation,
                ..SessionConfig::default()
            };
            let started = Instant::now();
            let s = ReplSession::new(
                config,
                Arc::clone(&eps),
                &[ContextSource::Text(text.clone())],
            )?;
            exec_ok(&s, "n = len(context)")?;
            Ok(started.elapsed())
        };
        load(Isolation::Process)?;
        let (mut local, mut isolated) = (Vec::new(), Vec::new());
        for _ in 0..rounds.min(5) {
            local.push(load(Isolation::None)?);
            std::thread::sleep(Duration::from_millis(300));
            isolated.push(load(Isolation::Process)?);
        }
        let (local, isolated) = (median(local), median(isolated));
        println!(
            "| a {mb} MB text context: start + first block (isolated: through a memfd) | {} | {} | {:+.1} ms |",
            ms(local),
            ms(isolated),
            (isolated.as_secs_f64() - local.as_secs_f64()) * 1000.0
        );

        // Restore after a crash: a fresh worker, the contexts, and N earlier blocks replayed
        // (each with a sub-call answered from the record).
        let blocks = 10;
        let mut restores = Vec::new();
        for _ in 0..rounds.min(5) {
            let s = session_in(&eps, Isolation::Process)?;
            for i in 0..blocks {
                exec_ok(&s, &format!("v{i} = llm_query('block {i}')"))?;
            }
            std::thread::sleep(Duration::from_millis(300));
            let crashed = s.exec("import ctypes\nctypes.string_at(0)")?;
            let restart = crashed
                .restart
                .ok_or_else(|| anyhow::anyhow!("the crash was not reported"))?;
            restores.push(Duration::from_secs_f64(restart.restore_ms / 1000.0));
            exec_ok(
                &s,
                &format!("assert v{} == 'block {}'", blocks - 1, blocks - 1),
            )?;
        }
        println!(
            "| restore after a crash: fresh worker + {blocks} blocks replayed (sub-calls from the record) | — | {} | — |",
            ms(median(restores))
        );
        drop((local_s, isolated_s));
        idle_block(&eps, quick)?;
        rt.block_on(server.shutdown());
        Ok(())
    }

    /// A block after its worker idled as long as a model call (50 ms), beyond the same block
    /// back to back, in a worker forked from a template that moved its code to huge pages and
    /// in one forked from a template that did not (`kernel::repl::use_huge_code`), alternated
    /// round by round. On a VM whose host takes back its mapping of guest memory left alone
    /// for some milliseconds (the bench guide, "After session 16"), the wait costs the block a
    /// trip to the host for each page it touches again; a huge page is one trip.
    fn idle_block(eps: &Arc<kernel::repl::Endpoints>, quick: bool) -> anyhow::Result<()> {
        const BLOCK: &str = "xs = [len(str(i)) for i in range(200)]\nprint(sum(xs))";
        // Executable anonymous mappings on a huge page in the worker: its moved code.
        const WINDOWS: &str = "import re\nhuge_windows, head = 0, None\nfor line in open('/proc/self/smaps'):\n    if re.match(r'[0-9a-f]+-[0-9a-f]+ ', line):\n        head = line.split()\n    elif line.startswith('AnonHugePages:') and head[1] == 'r-xp' and len(head) == 5 and int(line.split()[1]) > 0:\n        huge_windows += 1\nprint(huge_windows)";
        let rounds = if quick { 9 } else { 31 };
        // A worker forked from a template of each kind: the first session after the switch
        // makes the template be replaced, and finds none yet; the next, a moment later, is
        // forked from the new one.
        let forked = |huge: bool| -> anyhow::Result<(ReplSession, String)> {
            kernel::repl::use_huge_code(huge);
            drop(session_in(eps, Isolation::Process)?);
            std::thread::sleep(Duration::from_millis(1500));
            let s = session_in(eps, Isolation::Process)?;
            let windows = s.exec(WINDOWS)?.stdout.trim().to_owned();
            exec_ok(&s, BLOCK)?;
            Ok((s, windows))
        };
        let (huge, huge_windows) = forked(true)?;
        let (plain, plain_windows) = forked(false)?;
        kernel::repl::use_huge_code(true);
        let [mut huge_back, mut huge_idle, mut plain_back, mut plain_idle]: [Vec<Duration>; 4] =
            Default::default();
        for round in 0..rounds {
            let kinds = [
                (&huge, &mut huge_back, &mut huge_idle),
                (&plain, &mut plain_back, &mut plain_idle),
            ];
            let order: Vec<_> = if round % 2 == 0 {
                kinds.into_iter().collect()
            } else {
                kinds.into_iter().rev().collect()
            };
            for (s, back, idle) in order {
                std::thread::sleep(Duration::from_millis(50));
                let started = Instant::now();
                exec_ok(s, BLOCK)?;
                idle.push(started.elapsed());
                let started = Instant::now();
                exec_ok(s, BLOCK)?;
                back.push(started.elapsed());
            }
        }
        println!();
        println!(
            "## a block after its worker idled 50 ms, beyond the same block back to back (median of {rounds}, alternated)"
        );
        println!(
            "| the worker's code | executable huge pages | back to back | after 50 ms idle | the wait's cost |"
        );
        println!("|---|---:|---:|---:|---:|");
        let mut cost = Vec::new();
        for (what, windows, back, idle) in [
            (
                "on huge pages (`use_huge_code(true)`, the default)",
                huge_windows,
                huge_back,
                huge_idle,
            ),
            (
                "in its files' pages (`use_huge_code(false)`)",
                plain_windows,
                plain_back,
                plain_idle,
            ),
        ] {
            let (back, idle) = (median(back), median(idle));
            let wait = idle.saturating_sub(back);
            cost.push(wait);
            println!(
                "| {what} | {windows} | {} | {} | {} |",
                ms(back),
                ms(idle),
                ms(wait)
            );
        }
        println!(
            "| on huge pages / in its files' pages | | | | {:.2}× |",
            cost[0].as_secs_f64() / cost[1].as_secs_f64().max(1e-9)
        );
        Ok(())
    }
}
