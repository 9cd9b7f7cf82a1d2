//! Run-tree benchmarks against the in-process mock LM server: `rlm_query` children and the
//! sub-call cache, each against a baseline measured in the same run.
//!
//! ```text
//! cargo bench -p rlm-benches --bench tree             # full (about two minutes)
//! cargo bench -p rlm-benches --bench tree -- --quick  # fewer rounds (or RLM_BENCH_QUICK=1)
//! cargo bench -p rlm-benches --bench tree -- --rows '| 50 ms'  # some of section 1's rows
//! ```
//!
//! `--rows TEXT` (or `RLM_BENCH_ROWS=TEXT`) runs only the rows of section 1 whose first two
//! cells, as printed (`process, confined ahead of need | 50 ms`), contain TEXT, and skips
//! sections 2 and 3: runs in turns of a few rows, without the rest of the bench's time.
//!
//! 1. The cost of a child beyond its model calls, per isolation mode: a block that runs N
//!    `rlm_query` children one after another (each a one-iteration RLM loop with a REPL
//!    session of its own), against N raw `Endpoint::call`s of the same requests the children
//!    send, alternated round by round. The difference per child is what a child costs: its
//!    session, loop, prompts and records (target: ≤ 1 ms). Two more baselines, measured in
//!    the same rounds, say how much of that difference is the machine's:
//!    - `llm_query` calls: the same number of requests, each a prompt as long as a child's
//!      first one, sent by `llm_query` from a block of a session in the same isolation, what
//!      the root's code would call instead of `rlm_query`. That block's worker waits for each
//!      answer as the root's worker waits for each child, so "a child beyond an `llm_query`"
//!      leaves out what waking the root's worker costs.
//!    - for the rows whose children run a block, at 50 ms: that block, run in the same
//!      session (handed the same context) after it waited as long as a child's model call,
//!      beyond the same block run back to back: what this machine charges a process to run
//!      again after it idled. A child that runs a block pays it in its own worker. On a VM
//!      whose host maps a guest's memory back page by page after a few ms idle, it is
//!      milliseconds (the bench guide, "After session 15" and "After session 16").
//!    - `none` (in-process sessions), children back to back;
//!    - `process` and `strict` (each child in a worker process of its own), back to back
//!      and at 50 ms of model latency, each two ways alternated round by round: the worker
//!      confined ahead of need (the default: forked from the worker template and confined
//!      while the run's root model, or the previous child, ran), and forked from the
//!      template and confined when the child's session starts (the pool off, the way before
//!      it). Back to back (every model answers at once), the next worker has only the
//!      previous child's own run to be confined in, and the run's first only the root
//!      model's instant reply; at 50 ms (the root model's and the children's), each has the
//!      time a real model's seconds give it.
//!    - the same children, their worker confined ahead of need, whose one reply runs a
//!      ```` ```repl ```` block that sets the answer (still one model call a child, so the
//!      same raw calls): the rows above answer `FINAL(ok)` without a block, so they never
//!      wait for their worker to be ready (it starts its session while the child's model
//!      call is out, and is closed unused); a child that runs code, as a user's does, waits
//!      for it at its first block.
//!    - children handed a piece of text (`rlm_query(q, context=piece)`, 100 000 characters:
//!      what a user's children get) whose block runs over it (`len(context.split())`), their
//!      worker confined ahead of need; the raw calls are the requests those children send
//!      (their first prompt describes the piece).
//!    - children handed a list of 1000 small dicts (`rlm_query(q, context=records)`, as
//!      `records[i:j]` is handed over: ~45 KB of JSON) whose block runs over it, their worker
//!      confined ahead of need; the raw calls' first prompt describes the same JSON.
//! 2. 100 children in parallel on one pool: `rlm_query_batched` of 100 one-iteration children
//!    at 50 ms model latency, against the bridge's own `Endpoint::batch` of the same 100
//!    requests at the same width: in-process sessions, and with isolation `process` (each
//!    child's worker forked from the template and confined, ahead of need while the pool has
//!    one ready, else when its session starts; the 100 confinements share the two cores with
//!    the mock server).
//! 3. The sub-call cache on a loop that repeats calls: 200 `llm_query` calls over 10 distinct
//!    prompts at 20 ms latency, with the cache on (the default) and off, on fresh endpoints
//!    each round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge::mock::{Latency, MockConfig, MockServer, Script};
use bridge::{
    BatchPolicy, Budget, CallOptions, CancellationToken, ChatRequest, EndpointConfig, Endpoints,
    Ledger,
};
use kernel::repl::{ContextSource, Isolation, ReplSession, SessionConfig};
use kernel::rlm::{Rlm, RlmConfig, RlmResult, TerminationReason};
use rlm_benches::median;
use serde_json::json;

fn main() -> anyhow::Result<()> {
    // Isolated children's workers are this binary started again.
    rlm_benches::serve_as_worker();
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("RLM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let rows = Rows::from_args()?;
    let mock_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("mock-lm")
        .enable_all()
        .build()?;
    println!(
        "# run-tree benchmarks{}{}",
        if quick { " (--quick)" } else { "" },
        rows.0
            .as_ref()
            .map_or(String::new(), |text| format!(" (rows with `{text}`)"))
    );
    println!();
    println!(
        "## 1. the cost of a child beyond its model call: sequential one-iteration children (median of {} rounds, each alternated with the raw calls)",
        child_rounds(quick)
    );
    println!(
        "| isolation | model latency | children | raw calls ms | block ms | / raw | **a child beyond its model call** (target ≤ 1 ms) | `llm_query` calls ms | a child beyond an `llm_query` | its block in a worker idle as long, beyond back to back |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let none = if quick { 20 } else { 100 };
    let isolated = if quick { 5 } else { 20 };
    child_overhead(
        &mock_rt,
        quick,
        Isolation::None,
        Duration::ZERO,
        none,
        &rows.of(Isolation::None, Duration::ZERO, &[WorkerStart::None]),
    )?;
    for isolation in [Isolation::Process, Isolation::Strict] {
        for latency in [Duration::ZERO, Duration::from_millis(50)] {
            // The children that answer at once, then those that run a block, then those
            // handed a piece of text, then those handed records.
            let groups: [&[WorkerStart]; 4] = [
                &[WorkerStart::Ready, WorkerStart::Template],
                &[WorkerStart::ReadyBlock],
                &[WorkerStart::ReadyContext],
                &[WorkerStart::ReadyRecords],
            ];
            for starts in groups {
                let starts = rows.of(isolation, latency, starts);
                child_overhead(&mock_rt, quick, isolation, latency, isolated, &starts)?;
            }
        }
    }
    if rows.0.is_none() {
        parallel_children(&mock_rt, quick)?;
        cache_on_a_repeating_loop(&mock_rt, quick)?;
    }
    Ok(())
}

/// `--rows TEXT` / `RLM_BENCH_ROWS`: the rows of section 1 to run (all without it).
struct Rows(Option<String>);

impl Rows {
    fn from_args() -> anyhow::Result<Rows> {
        let mut args = std::env::args().skip_while(|a| a != "--rows").skip(1);
        let text = match args.next() {
            Some(text) => Some(text),
            None if std::env::args().any(|a| a == "--rows") => {
                anyhow::bail!("`--rows` needs the text of the rows to run, e.g. `--rows '| 50 ms'`")
            }
            None => std::env::var("RLM_BENCH_ROWS")
                .ok()
                .filter(|t| !t.is_empty()),
        };
        Ok(Rows(text))
    }

    /// The ways in `starts` whose rows (isolation, latency) are to run.
    fn of(
        &self,
        isolation: Isolation,
        latency: Duration,
        starts: &[WorkerStart],
    ) -> Vec<WorkerStart> {
        starts
            .iter()
            .copied()
            .filter(|start| {
                self.0
                    .as_ref()
                    .is_none_or(|text| row_text(isolation, *start, latency).contains(text.as_str()))
            })
            .collect()
    }
}

/// A row of section 1's first two cells, as printed.
fn row_text(isolation: Isolation, start: WorkerStart, latency: Duration) -> String {
    format!(
        "{}{} | {} ms",
        isolation.as_str(),
        start.label(),
        latency.as_millis()
    )
}

/// A child's one reply: `FINAL(ok)`, no block.
const FINAL_OK: &str = "FINAL(ok)";

/// [`start_mock_with`] whose children answer [`FINAL_OK`].
fn start_mock(
    rt: &tokio::runtime::Runtime,
    root_reply: &str,
    root_latency: Latency,
    latency: Latency,
) -> anyhow::Result<MockServer> {
    start_mock_with(rt, root_reply, root_latency, FINAL_OK, latency)
}

/// A mock: `root` replies `root_reply` after `root_latency`, then nothing more is needed (the
/// block sets the answer); `sub` answers a child RLM (recognised by the RLM system prompt)
/// with `child_reply`, section 1's `llm_query` baseline (`baseline question …`) with `ok`,
/// and echoes any other prompt, after `latency`.
fn start_mock_with(
    rt: &tokio::runtime::Runtime,
    root_reply: &str,
    root_latency: Latency,
    child_reply: &str,
    latency: Latency,
) -> anyhow::Result<MockServer> {
    let script = Script::from_json_value(json!({"models": {
        "root": {"replies": [root_reply], "latency": root_latency},
        "sub": {
            "rules": [
                {"system": "recursive language model", "reply": child_reply},
                {"last_user": "^baseline question ", "reply": "ok"}
            ],
            "fallback": {"behaviour": "echo"}
        }
    }}))?;
    Ok(rt.block_on(MockServer::start(MockConfig {
        script,
        latency,
        ..MockConfig::default()
    }))?)
}

fn endpoints(server: &MockServer) -> anyhow::Result<Arc<Endpoints>> {
    let url = server.openai_base_url();
    let root = EndpointConfig {
        counts_toward_call_budget: false,
        ..EndpointConfig::openai("root", &url, "root")
    };
    let sub = EndpointConfig {
        max_in_flight: 256,
        ..EndpointConfig::openai("sub", &url, "sub")
    };
    Ok(Arc::new(Endpoints::new(
        vec![root, sub],
        Arc::new(Ledger::new(Budget::default())),
    )?))
}

fn block(code: &str) -> String {
    format!("```repl\n{code}\n```")
}

/// One run of the root loop at `max_depth`, checked to end with `expected`; its session
/// and its children's are in-process.
fn run(eps: &Arc<Endpoints>, max_depth: u32, expected: &str) -> anyhow::Result<RlmResult> {
    run_in(eps, max_depth, Isolation::None, expected)
}

/// [`run`] with the sessions in `isolation`.
fn run_in(
    eps: &Arc<Endpoints>,
    max_depth: u32,
    isolation: Isolation,
    expected: &str,
) -> anyhow::Result<RlmResult> {
    let session = ReplSession::new(
        SessionConfig {
            cell_timeout: Duration::from_secs(600),
            isolation,
            ..SessionConfig::default()
        },
        Arc::clone(eps),
        &[],
    )?;
    let config = RlmConfig {
        max_depth,
        ..RlmConfig::default()
    };
    let result = Rlm::new(config, Arc::clone(eps), Arc::new(session)).run("q")?;
    anyhow::ensure!(
        result.termination_reason == TerminationReason::FinalAnswer
            && result.answer.as_deref() == Some(expected),
        "the run ended with {:?} / {:?} ({:?})",
        result.termination_reason,
        result.answer,
        result.error
    );
    Ok(result)
}

/// A session's contexts that hold what a child is handed, any file of them in `dir`.
fn contexts(dir: &std::path::Path, handed: Option<&Handed>) -> anyhow::Result<Vec<ContextSource>> {
    Ok(match handed {
        None => Vec::new(),
        Some(Handed::Text(text)) => vec![ContextSource::Text(text.clone())],
        // A child's records are described as a JSON file of theirs is.
        Some(Handed::Records(json)) => {
            let file = dir.join("rlm-child-context-1-0.json");
            std::fs::write(&file, json)?;
            vec![ContextSource::Path(file)]
        }
    })
}

/// The requests the children of `queries` send first (a child with `context` or none, at
/// the last depth, whose root model is `sub`).
fn child_requests(
    eps: &Arc<Endpoints>,
    queries: &[String],
    context: Option<&Handed>,
) -> anyhow::Result<Vec<ChatRequest>> {
    let dir = tempfile::tempdir()?;
    let contexts = contexts(dir.path(), context)?;
    let session = Arc::new(ReplSession::new(
        SessionConfig::default(),
        Arc::clone(eps),
        &contexts,
    )?);
    let config = RlmConfig {
        root_endpoint: "sub".into(),
        ..RlmConfig::default()
    };
    let rlm = Rlm::new(config, Arc::clone(eps), session);
    Ok(queries
        .iter()
        .map(|q| ChatRequest {
            messages: rlm.first_messages(q),
            ..ChatRequest::default()
        })
        .collect())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn child_rounds(quick: bool) -> usize {
    if quick { 3 } else { 7 }
}

/// How an isolated child's worker process starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerStart {
    /// In-process sessions: no worker.
    None,
    /// Forked by the worker template and confined ahead of need (the default).
    Ready,
    /// Forked by the worker template and confined when the child's session starts: the
    /// path before the pool, still taken when no confined worker is ready.
    Template,
    /// As [`WorkerStart::Ready`], and the child's one reply runs a block that sets the
    /// answer (so it waits for its worker), not `FINAL(ok)`.
    ReadyBlock,
    /// As [`WorkerStart::ReadyBlock`], the child handed [`PIECE_CHARS`] of text and its
    /// block running over it.
    ReadyContext,
    /// As [`WorkerStart::ReadyBlock`], the child handed [`RECORDS`] small dicts and its block
    /// running over them.
    ReadyRecords,
}

/// What a child of section 1 is handed.
enum Handed {
    /// [`piece`].
    Text(String),
    /// [`records`], as the JSON the parent's worker hands over.
    Records(String),
}

/// The dicts each child of [`WorkerStart::ReadyRecords`] is handed.
const RECORDS: usize = 1000;

/// The root code's expression of the records (built the same way by [`records`]).
fn records_code() -> String {
    format!("[{{'id': i, 'name': f'user {{i}}', 'ok': i % 3 == 0}} for i in range({RECORDS})]")
}

/// The JSON of [`records_code`]'s list, as Python's `json.dumps` writes it.
fn records() -> String {
    let items: Vec<String> = (0..RECORDS)
        .map(|i| {
            format!(
                "{{\"id\": {i}, \"name\": \"user {i}\", \"ok\": {}}}",
                i % 3 == 0
            )
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// The characters of text each child of [`WorkerStart::ReadyContext`] is handed.
const PIECE_CHARS: usize = 100_000;

/// What the piece of text is made of: words of prose.
const PHRASE: &str = "lorem ipsum dolor sit amet, consectetur adipiscing elit. ";

/// The text each child of [`WorkerStart::ReadyContext`] is handed (the root's code builds
/// the same one).
fn piece() -> String {
    PHRASE
        .repeat(PIECE_CHARS / PHRASE.len() + 1)
        .chars()
        .take(PIECE_CHARS)
        .collect()
}

impl WorkerStart {
    fn label(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Ready => ", confined ahead of need",
            Self::Template => ", forked from the template when needed (no pool)",
            Self::ReadyBlock => ", confined ahead of need, the child runs a block",
            Self::ReadyContext => {
                ", confined ahead of need, the child gets 100 KB of text and runs a block over it"
            }
            Self::ReadyRecords => {
                ", confined ahead of need, the child gets 1000 dicts and runs a block over them"
            }
        }
    }

    /// What each child is handed, if anything.
    fn handed(self) -> Option<Handed> {
        match self {
            Self::ReadyContext => Some(Handed::Text(piece())),
            Self::ReadyRecords => Some(Handed::Records(records())),
            Self::None | Self::Ready | Self::Template | Self::ReadyBlock => None,
        }
    }

    /// The code of the block each child runs, if it runs one.
    fn child_code(self) -> Option<&'static str> {
        match self {
            Self::ReadyBlock => Some("answer['content'] = 'ok'\nanswer['ready'] = True"),
            Self::ReadyContext => Some(
                "words = len(context.split())\nanswer['content'] = 'ok' if words else 'empty'\nanswer['ready'] = True",
            ),
            Self::ReadyRecords => Some(
                "kept = sum(1 for r in context if r['ok'])\nanswer['content'] = 'ok' if kept else 'empty'\nanswer['ready'] = True",
            ),
            Self::None | Self::Ready | Self::Template => None,
        }
    }

    /// What each child replies (its one model call).
    fn child_reply(self) -> String {
        self.child_code().map_or(FINAL_OK.to_owned(), block)
    }
}

/// Section 1's rows for `isolation` at `latency`: one per way a worker starts in `starts`
/// (all with the same child reply), each against the same raw calls, the ways taking turns
/// to go first round by round.
fn child_overhead(
    rt: &tokio::runtime::Runtime,
    quick: bool,
    isolation: Isolation,
    latency: Duration,
    n: usize,
    starts: &[WorkerStart],
) -> anyhow::Result<()> {
    if starts.is_empty() {
        return Ok(());
    }
    let rounds = child_rounds(quick);
    let handed = starts.first().and_then(|s| s.handed());
    let code = match &handed {
        None => format!(
            "r = [rlm_query(f'question {{i}}') for i in range({n})]\nassert r == ['ok'] * {n}, r[:3]\nFINAL_VAR(len(r))"
        ),
        Some(Handed::Text(_)) => format!(
            "piece = ({PHRASE:?} * {})[:{PIECE_CHARS}]\nr = [rlm_query(f'question {{i}}', context=piece) for i in range({n})]\nassert r == ['ok'] * {n}, r[:3]\nFINAL_VAR(len(r))",
            PIECE_CHARS / PHRASE.len() + 1
        ),
        Some(Handed::Records(_)) => format!(
            "records = {}\nr = [rlm_query(f'question {{i}}', context=records) for i in range({n})]\nassert r == ['ok'] * {n}, r[:3]\nFINAL_VAR(len(r))",
            records_code()
        ),
    };
    let mock_latency = if latency.is_zero() {
        Latency::None
    } else {
        Latency::fixed(latency)
    };
    let child_reply = starts
        .first()
        .map_or(FINAL_OK.to_owned(), |s| s.child_reply());
    // The root model takes as long as the children's (a real one takes longer still): the
    // run's first worker is confined meanwhile, as in real use.
    let server = start_mock_with(rt, &block(&code), mock_latency, &child_reply, mock_latency)?;
    let eps = endpoints(&server)?;
    let queries: Vec<String> = (0..n).map(|i| format!("question {i}")).collect();
    let requests = child_requests(&eps, &queries, handed.as_ref())?;
    let sub = eps.get("sub")?;
    let shared = kernel::runtime::shared();
    let raw = |requests: &[ChatRequest]| -> anyhow::Result<Duration> {
        let started = Instant::now();
        for request in requests {
            shared.block_on(sub.call(request.clone(), &CallOptions::default()))?;
        }
        Ok(started.elapsed())
    };
    // The baselines' session: the same isolation, handed what a child is.
    let dir = tempfile::tempdir()?;
    let baseline = ReplSession::new(
        SessionConfig {
            cell_timeout: Duration::from_secs(600),
            isolation,
            ..SessionConfig::default()
        },
        Arc::clone(&eps),
        &contexts(dir.path(), handed.as_ref())?,
    )?;
    let exec = |code: &str| -> anyhow::Result<f64> {
        let result = baseline.exec(code)?;
        anyhow::ensure!(
            result.error.is_none(),
            "a baseline block failed: {:?}",
            result.error
        );
        Ok(ms(result.duration))
    };
    // The children's requests by `llm_query`, each prompt as long as a child's first one and
    // new to the sub-call cache each round.
    let chars: usize = requests[0].messages.iter().map(|m| m.content.len()).sum();
    let llm = |round: usize| -> anyhow::Result<f64> {
        exec(&format!(
            "pad = '.' * {}\nr = [llm_query(f'baseline question {{i}} round {round} ' + pad) for i in range({n})]\nassert r == ['ok'] * {n}, r[:3]",
            chars.saturating_sub(40)
        ))
    };
    // The children's block in that session after it waited as long as a child's model call,
    // and back to back (at 50 ms, for the rows whose children run one).
    let idle_code = starts
        .first()
        .and_then(|s| s.child_code())
        .filter(|_| !latency.is_zero());
    let idle = |code: &str| -> anyhow::Result<(f64, f64)> {
        let (mut waited, mut back) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            std::thread::sleep(latency);
            waited.push(exec(code)?);
        }
        for _ in 0..3 {
            back.push(exec(code)?);
        }
        Ok((median(waited), median(back)))
    };
    let expected = n.to_string();
    let run_with = |start: WorkerStart| -> anyhow::Result<f64> {
        kernel::repl::use_worker_pool(start != WorkerStart::Template);
        let result = run_in(&eps, 2, isolation, &expected)?;
        Ok(result.iterations[0].execution_ms)
    };
    raw(&requests)?;
    llm(rounds)?;
    for &start in starts {
        run_with(start)?;
    }
    let (mut raw_ms, mut llm_ms) = (Vec::new(), Vec::new());
    let (mut waited_ms, mut back_ms) = (Vec::new(), Vec::new());
    let mut block_ms = vec![Vec::new(); starts.len()];
    for round in 0..rounds {
        raw_ms.push(ms(raw(&requests)?));
        llm_ms.push(llm(round)?);
        for k in 0..starts.len() {
            let i = (round + k) % starts.len();
            block_ms[i].push(run_with(starts[i])?);
        }
        if let Some(code) = idle_code {
            let (waited, back) = idle(code)?;
            waited_ms.push(waited);
            back_ms.push(back);
        }
    }
    kernel::repl::use_worker_pool(true);
    let raw = median(raw_ms);
    let llm = median(llm_ms);
    let idle = match idle_code {
        Some(_) => format!("{:.3} ms", median(waited_ms) - median(back_ms)),
        None => "—".to_owned(),
    };
    for (start, block_ms) in starts.iter().zip(&block_ms) {
        let children = median(block_ms.clone());
        let per_child = (children - raw) / n as f64;
        let beyond_llm = (children - llm) / n as f64;
        // No verdict beside the figure: the header names the target, and a row's text must not
        // change with its value (`compare.py` pairs rows by their text).
        println!(
            "| {} | {n} | {raw:.1} | {children:.1} | {:.2}× | **{per_child:.3} ms** | {llm:.1} | {beyond_llm:.3} ms | {idle} |",
            row_text(isolation, *start, latency),
            children / raw,
        );
    }
    drop(baseline);
    rt.block_on(server.shutdown());
    Ok(())
}

fn parallel_children(rt: &tokio::runtime::Runtime, quick: bool) -> anyhow::Result<()> {
    const N: usize = 100;
    let rounds = if quick { 2 } else { 5 };
    let latency = Duration::from_millis(50);
    let code = format!(
        "r = rlm_query_batched([f'question {{i}}' for i in range({N})])\nassert r == ['ok'] * {N}, r[:3]\nFINAL_VAR(len(r))"
    );
    let server = start_mock(rt, &block(&code), Latency::None, Latency::fixed(latency))?;
    let eps = endpoints(&server)?;
    let queries: Vec<String> = (0..N).map(|i| format!("question {i}")).collect();
    let requests = child_requests(&eps, &queries, None)?;
    let sub = eps.get("sub")?;
    let shared = kernel::runtime::shared();
    let batch = || -> anyhow::Result<Duration> {
        let started = Instant::now();
        let out = shared.block_on(sub.batch(
            requests.clone(),
            BatchPolicy::bounded(N),
            &CancellationToken::new(),
        ));
        anyhow::ensure!(out.iter().all(Result::is_ok), "a raw call failed");
        Ok(started.elapsed())
    };
    let expected = N.to_string();
    batch()?;
    run(&eps, 2, &expected)?;
    run_in(&eps, 2, Isolation::Process, &expected)?;
    let (mut batch_ms, mut block_ms, mut isolated_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut flight, mut isolated_flight) = (0, 0);
    for _ in 0..rounds {
        batch_ms.push(ms(batch()?));
        server.log().clear();
        let result = run(&eps, 2, &expected)?;
        flight = flight.max(server.log().max_concurrency());
        block_ms.push(result.iterations[0].execution_ms);
        server.log().clear();
        let result = run_in(&eps, 2, Isolation::Process, &expected)?;
        isolated_flight = isolated_flight.max(server.log().max_concurrency());
        isolated_ms.push(result.iterations[0].execution_ms);
    }
    let (bridge, children) = (median(batch_ms), median(block_ms));
    let isolated = median(isolated_ms);
    println!();
    println!(
        "## 2. {N} children in parallel on one pool, {} ms model latency (median of {rounds} rounds)",
        latency.as_millis()
    );
    println!("| path | wall ms | / bridge | max in flight (mock log) |");
    println!("|---|---:|---:|---:|");
    println!("| bridge `Endpoint::batch` of the {N} requests | {bridge:.1} | 1.00× | — |");
    println!(
        "| block: `rlm_query_batched` of {N} children | {children:.1} | {:.2}× | {flight} |",
        children / bridge
    );
    println!(
        "| the same, isolation `process` (a worker each, the root's too) | {isolated:.1} | {:.2}× | {isolated_flight} |",
        isolated / bridge
    );
    rt.block_on(server.shutdown());
    Ok(())
}

fn cache_on_a_repeating_loop(rt: &tokio::runtime::Runtime, quick: bool) -> anyhow::Result<()> {
    const CALLS: usize = 200;
    const DISTINCT: usize = 10;
    let rounds = if quick { 2 } else { 5 };
    let latency = Duration::from_millis(20);
    let code = format!(
        "r = [llm_query(f'item {{i % {DISTINCT}}}') for i in range({CALLS})]\nassert r[13] == 'item 3', r[13]\nFINAL_VAR(len(r))"
    );
    let server = start_mock(rt, &block(&code), Latency::None, Latency::fixed(latency))?;
    let expected = CALLS.to_string();
    let mut walls = [Vec::new(), Vec::new()];
    let mut sent = [0, 0];
    for round in 0..=rounds {
        for (slot, caching) in [(0, false), (1, true)] {
            let eps = endpoints(&server)?;
            eps.sub_calls().set_caching(caching);
            server.log().clear();
            let result = run(&eps, 1, &expected)?;
            if round > 0 {
                walls[slot].push(result.iterations[0].execution_ms);
            }
            sent[slot] = server.log().entries().len() - 1;
        }
    }
    let (off, on) = {
        let [off, on] = walls;
        (median(off), median(on))
    };
    println!();
    println!(
        "## 3. the sub-call cache: {CALLS} `llm_query` calls over {DISTINCT} distinct prompts, {} ms latency (median of {rounds} rounds)",
        latency.as_millis()
    );
    println!("| cache | block ms | requests sent | / cache off |");
    println!("|---|---:|---:|---:|");
    println!(
        "| off (`--no-sub-call-cache`) | {off:.1} | {} | 1.00× |",
        sent[0]
    );
    println!(
        "| on (default) | {on:.1} | {} | {:.3}× |",
        sent[1],
        on / off
    );
    rt.block_on(server.shutdown());
    Ok(())
}
