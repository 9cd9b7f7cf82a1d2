//! Sub-call throughput of the bridge against the in-process mock LM server.
//!
//! ```text
//! cargo bench -p rlm-benches --bench bridge             # full matrix (about a minute)
//! cargo bench -p rlm-benches --bench bridge -- --quick  # a few rows (or RLM_BENCH_QUICK=1)
//! cargo bench -p rlm-benches --bench bridge -- --k 1000 --latency-ms 50 --concurrency 256,unbounded
//! ```
//!
//! For each K (calls), mock latency and batch width, one `Endpoint::batch` of K echo
//! requests runs on a client tokio runtime while the mock serves from a runtime of its own.
//! Every tokio worker registers its thread id on start, so the CPU time of each side is read
//! per thread (`/proc/self/task/TID/schedstat`, nanoseconds; the thread calling `block_on` is
//! counted as client): "client CPU" excludes the mock's work.
//!
//! Columns: wall time, calls/s, client CPU seconds, mock CPU seconds, p50/p99 per-call
//! overhead (the call's latency from its permit to its parsed answer, minus the mock's
//! configured latency), the ideal `latency × ceil(K / width)` and the ratio wall / ideal.
//! Before each measured run a warm-up batch of the same width opens the connections, so the
//! measurement is of steady state (keep-alive), not of TCP handshakes.
//!
//! The open-file limit is raised to its hard maximum; when that cannot hold `width` client
//! plus server sockets, the endpoint's limiter caps the width (marked `*`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bridge::mock::{Latency, MockConfig, MockServer};
use bridge::{
    BatchPolicy, Budget, CancellationToken, ChatRequest, Endpoint, EndpointConfig, Ledger,
    RetryPolicy,
};
use rlm_benches::percentile;

/// File descriptors kept free for everything that is not a client/server socket pair.
const FD_RESERVE: u64 = 512;

fn main() -> anyhow::Result<()> {
    let options = Options::parse(std::env::args().skip(1))?;
    let fd_limit = raise_fd_limit();
    let max_width = usize::try_from(fd_limit.saturating_sub(FD_RESERVE) / 2)
        .unwrap_or(usize::MAX)
        .max(1);

    let server_threads = ThreadSet::default();
    let client_threads = ThreadSet::default();
    let server_rt = {
        let threads = server_threads.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.server_threads)
            .thread_name("mock-lm")
            .on_thread_start(move || threads.add_current())
            .enable_all()
            .build()?
    };
    let client_rt = {
        let threads = client_threads.clone();
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("client")
            .on_thread_start(move || threads.add_current())
            .enable_all()
            .build()?
    };
    client_threads.add_current();

    println!(
        "bridge benchmark: {} client worker threads + block_on thread, {} mock threads, \
         RLIMIT_NOFILE {fd_limit} (width capped at {max_width})",
        client_rt.metrics().num_workers(),
        options.server_threads,
    );
    println!();
    println!(
        "{:>6} {:>7} {:>10} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>6}",
        "K",
        "lat ms",
        "width",
        "wall s",
        "calls/s",
        "cli CPU",
        "mock CPU",
        "p50 ovh",
        "p99 ovh",
        "ideal s",
        "ratio",
        "errors"
    );

    let mut target = None;
    for &latency_ms in &options.latencies_ms {
        let latency = Duration::from_millis(latency_ms);
        let server = server_rt.block_on(MockServer::start(MockConfig {
            latency: Latency::fixed(latency),
            ..MockConfig::default()
        }))?;
        for &k in &options.ks {
            for &width in &options.widths {
                let row = run(
                    &client_rt,
                    &server,
                    Scenario {
                        k,
                        latency,
                        width,
                        max_width,
                    },
                    &client_threads,
                    &server_threads,
                )?;
                row.print();
                if k == 1000 && latency_ms == 50 && width == Some(256) {
                    target = Some(row.ratio);
                }
            }
        }
        server_rt.block_on(server.shutdown());
    }
    println!();
    println!("ms columns are per call; ratio = wall / ideal; * = width capped by the fd limit.");
    if let Some(Some(ratio)) = target {
        let verdict = if ratio <= 1.15 { "met" } else { "MISSED" };
        println!("target (50 ms, K=1000, width 256, wall <= 1.15x ideal): {ratio:.3}x, {verdict}");
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
struct Scenario {
    k: usize,
    latency: Duration,
    /// `None` = unbounded.
    width: Option<usize>,
    max_width: usize,
}

#[derive(Debug)]
struct Row {
    scenario: Scenario,
    effective_width: usize,
    wall: Duration,
    client_cpu: f64,
    server_cpu: f64,
    p50_ms: f64,
    p99_ms: f64,
    ideal: Duration,
    ratio: Option<f64>,
    errors: usize,
}

impl Row {
    fn print(&self) {
        let s = &self.scenario;
        let width = match s.width {
            Some(w) => w.to_string(),
            None => "unbounded".to_owned(),
        };
        let capped = if self.effective_width < s.width.unwrap_or(s.k).min(s.k) {
            "*"
        } else {
            ""
        };
        let calls_per_s = s.k as f64 / self.wall.as_secs_f64();
        let ratio = self
            .ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}"));
        println!(
            "{:>6} {:>7} {:>10} {:>8.3} {:>9.0} {:>8.3} {:>8.3} {:>9.3} {:>9.3} {:>8.3} {:>7} {:>6}",
            s.k,
            s.latency.as_millis(),
            format!("{width}{capped}"),
            self.wall.as_secs_f64(),
            calls_per_s,
            self.client_cpu,
            self.server_cpu,
            self.p50_ms,
            self.p99_ms,
            self.ideal.as_secs_f64(),
            ratio,
            self.errors,
        );
    }
}

fn run(
    rt: &tokio::runtime::Runtime,
    server: &MockServer,
    scenario: Scenario,
    client_threads: &ThreadSet,
    server_threads: &ThreadSet,
) -> anyhow::Result<Row> {
    let Scenario {
        k,
        latency,
        width,
        max_width,
    } = scenario;
    let effective_width = width.unwrap_or(k).min(k).min(max_width).max(1);
    let config = EndpointConfig {
        timeout: Duration::from_secs(60),
        max_in_flight: max_width,
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..EndpointConfig::openai("sub", server.openai_base_url(), "bench")
    };
    let endpoint = Endpoint::new(config, Arc::new(Ledger::new(Budget::default())))?;
    let policy = BatchPolicy { concurrency: width };
    let cancel = CancellationToken::new();
    let requests = |n: usize| -> Vec<ChatRequest> {
        (0..n)
            .map(|i| ChatRequest::from_prompt(format!("Summarise item {i} in one word.")))
            .collect()
    };

    let warmup = rt.block_on(endpoint.batch(requests(effective_width), policy, &cancel));
    let warm_errors = warmup.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(
        warm_errors == 0,
        "{warm_errors} warm-up calls failed, e.g. {:?}",
        warmup.iter().find_map(|r| r.as_ref().err())
    );

    let reqs = requests(k);
    let (client_before, server_before) = (client_threads.cpu_secs(), server_threads.cpu_secs());
    let start = Instant::now();
    let results = rt.block_on(endpoint.batch(reqs, policy, &cancel));
    let wall = start.elapsed();
    let (client_after, server_after) = (client_threads.cpu_secs(), server_threads.cpu_secs());

    let mut overheads: Vec<f64> = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|a| a.latency.saturating_sub(latency).as_secs_f64() * 1e3)
        .collect();
    overheads.sort_by(f64::total_cmp);
    let errors = results.len() - overheads.len();
    let rounds = k.div_ceil(effective_width);
    let ideal = latency * u32::try_from(rounds).context("too many rounds")?;
    Ok(Row {
        scenario,
        effective_width,
        wall,
        client_cpu: client_after - client_before,
        server_cpu: server_after - server_before,
        p50_ms: percentile(&overheads, 0.50),
        p99_ms: percentile(&overheads, 0.99),
        ideal,
        ratio: (!ideal.is_zero()).then(|| wall.as_secs_f64() / ideal.as_secs_f64()),
        errors,
    })
}

/// Thread ids of one side (client or mock), for per-thread CPU accounting.
#[derive(Debug, Clone, Default)]
struct ThreadSet(Arc<Mutex<Vec<libc::pid_t>>>);

impl ThreadSet {
    fn add_current(&self) {
        // SAFETY: `gettid` has no preconditions and cannot fail.
        let tid = unsafe { libc::gettid() };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tid);
    }

    /// CPU seconds used so far by the registered threads that are still alive.
    fn cpu_secs(&self) -> f64 {
        let tids = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        tids.into_iter().map(thread_cpu_secs).sum()
    }
}

/// CPU time of thread `tid` of this process: `schedstat` (ns) or, failing that, `stat` ticks.
fn thread_cpu_secs(tid: libc::pid_t) -> f64 {
    let dir = format!("/proc/self/task/{tid}");
    if let Some(ns) = std::fs::read_to_string(format!("{dir}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
    {
        return ns as f64 / 1e9;
    }
    let Ok(stat) = std::fs::read_to_string(format!("{dir}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: `sysconf` has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 / hz as f64
}

/// Raise the soft open-file limit to the hard one; returns the limit in force.
fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    let wanted = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: `wanted` is a valid `rlimit`; failure leaves the old limit in place.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
        limit = wanted;
    }
    limit.rlim_cur
}

#[derive(Debug)]
struct Options {
    ks: Vec<usize>,
    latencies_ms: Vec<u64>,
    widths: Vec<Option<usize>>,
    server_threads: usize,
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> anyhow::Result<Self> {
        let quick = std::env::var("RLM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let mut options = if quick {
            Self::quick()
        } else {
            Self {
                ks: vec![100, 1000, 10_000],
                latencies_ms: vec![0, 50],
                widths: vec![Some(16), Some(64), Some(256), None],
                server_threads: 1,
            }
        };
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .with_context(|| format!("`{name}` needs a value"))
            };
            match arg.as_str() {
                "--quick" => {
                    let threads = options.server_threads;
                    options = Self {
                        server_threads: threads,
                        ..Self::quick()
                    };
                }
                "--k" => options.ks = parse_list(&value("--k")?)?,
                "--latency-ms" => options.latencies_ms = parse_list(&value("--latency-ms")?)?,
                "--concurrency" => {
                    options.widths = value("--concurrency")?
                        .split(',')
                        .map(|w| match w.trim() {
                            "unbounded" | "none" => Ok(None),
                            n => n.parse().map(Some).with_context(|| {
                                format!("`--concurrency` takes numbers or `unbounded`, got `{n}`")
                            }),
                        })
                        .collect::<anyhow::Result<_>>()?;
                }
                "--server-threads" => {
                    options.server_threads = value("--server-threads")?.parse()?;
                }
                // `cargo bench` passes `--bench`; libtest filters are not used here.
                _ => {}
            }
        }
        Ok(options)
    }

    fn quick() -> Self {
        Self {
            ks: vec![1000],
            latencies_ms: vec![0, 50],
            widths: vec![Some(64), Some(256)],
            server_threads: 1,
        }
    }
}

fn parse_list<T: std::str::FromStr>(s: &str) -> anyhow::Result<Vec<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .with_context(|| format!("invalid list item `{x}`"))
        })
        .collect()
}
