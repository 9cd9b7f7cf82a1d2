//! `llm_query` / `llm_query_batched` over real HTTP against the in-process mock LM server.

use std::time::{Duration, Instant};

use bridge::mock::{FaultKind, Faults, Latency, MockConfig};
use bridge::{Budget, SubCallMetadata};
use kernel::repl::{ReplSession, SessionConfig, SubCallErrorMode};

use crate::support::{Mock, ok};

fn session_on(mock: &Mock, config: SessionConfig) -> ReplSession {
    ReplSession::new(config, mock.endpoints.clone(), &[]).expect("session starts")
}

#[test]
fn llm_query_answers_and_records_the_call() {
    let mock = Mock::start(MockConfig::default(), Budget::default());
    let s = session_on(&mock, SessionConfig::default());
    let r = ok(&s, "reply = llm_query('ping from python')\nprint(reply)");
    assert_eq!(r.stdout, "ping from python\n");
    assert_eq!(r.llm_query_calls, 1);
    assert_eq!(r.llm_query_batched_calls, 0);
    assert_eq!(r.sub_calls.len(), 1);
    let call: &SubCallMetadata = &r.sub_calls[0];
    assert_eq!(call.endpoint, "sub");
    assert_eq!(call.prompt_chars, "ping from python".len());
    assert!(call.error.is_none());
    // The next block reports only its own calls.
    let r = ok(&s, "x = 1");
    assert!(r.sub_calls.is_empty());
    assert_eq!(r.llm_query_calls, 0);
    assert_eq!(mock.server.log().len(), 1);
}

#[test]
fn model_selects_an_endpoint_and_bad_arguments_raise() {
    let mock = Mock::start(MockConfig::default(), Budget::default());
    let s = session_on(&mock, SessionConfig::default());
    let r = ok(&s, "print(llm_query('hi', model='other'))");
    assert_eq!(r.stdout, "hi\n");
    let models: Vec<String> = mock
        .server
        .log()
        .entries()
        .into_iter()
        .map(|e| e.model)
        .collect();
    assert_eq!(models, ["other-model"]);
    let r = ok(&s, "print(llm_query('hi', model='nope'))");
    assert!(r.stdout.starts_with("Error: "), "{}", r.stdout);
    assert!(r.stdout.contains("nope"), "{}", r.stdout);
    // Never sent, so no sub-call of the ledger's, but an error the code got.
    assert_eq!((r.sub_calls.len(), r.sub_call_errors), (0, 1));
    let r = s
        .exec("llm_query(['not', 'a', 'str'])")
        .expect("kernel works");
    let err = r.error.expect("TypeError");
    assert_eq!(err.type_name, "TypeError");
    assert!(err.message.contains("must be a str"), "{}", err.message);
    let r = s
        .exec("llm_query_batched('one string')")
        .expect("kernel works");
    assert_eq!(r.error.expect("TypeError").type_name, "TypeError");
}

#[test]
fn batched_1000_prompts_come_back_in_order_with_per_item_errors() {
    let faults = Faults::random(0.1, vec![FaultKind::ServerError, FaultKind::MalformedJson]);
    let mock = Mock::start(
        MockConfig {
            faults,
            seed: 7,
            ..MockConfig::default()
        },
        Budget::default(),
    );
    let s = session_on(
        &mock,
        SessionConfig {
            batch_concurrency: Some(32),
            ..SessionConfig::default()
        },
    );
    let r = ok(
        &s,
        "prompts = [f'item {i}' for i in range(1000)]\nresults = llm_query_batched(prompts)\n\
         ok = sum(r == p for r, p in zip(results, prompts))\n\
         errors = sum(r.startswith('Error: ') for r in results)\n\
         print(len(results), ok + errors, errors)",
    );
    let fields: Vec<usize> = r
        .stdout
        .split_whitespace()
        .map(|f| f.parse().expect("number"))
        .collect();
    assert_eq!(fields[0], 1000);
    assert_eq!(fields[1], 1000, "every slot is its own answer or an error");
    let failed_requests = mock
        .server
        .log()
        .entries()
        .iter()
        .filter(|e| e.fault.is_some())
        .count();
    assert!(fields[2] > 0, "faults were injected");
    assert_eq!(
        fields[2], failed_requests,
        "one error per faulted request (no retries)"
    );
    assert_eq!(r.llm_query_batched_calls, 1);
    assert_eq!(r.sub_calls.len(), 1000);
    assert!(
        r.sub_calls
            .iter()
            .all(|c| c.batched && c.batch_size == 1000)
    );
    assert_eq!(
        r.sub_calls.iter().filter(|c| c.error.is_some()).count(),
        failed_requests
    );
    assert_eq!(r.sub_call_errors as usize, failed_requests);
}

#[test]
fn raise_mode_raises_llm_query_error() {
    let faults = Faults::fail_first(1, FaultKind::ServerError);
    let mock = Mock::start(
        MockConfig {
            faults,
            ..MockConfig::default()
        },
        Budget::default(),
    );
    let s = session_on(
        &mock,
        SessionConfig {
            sub_call_errors: SubCallErrorMode::Raise,
            ..SessionConfig::default()
        },
    );
    let r = ok(
        &s,
        "try:\n    llm_query('first fails')\nexcept LlmQueryError as e:\n    print('caught', e.kind)\nprint(llm_query('second works'))",
    );
    assert_eq!(r.stdout, "caught http_5xx\nsecond works\n");
    assert_eq!(r.sub_call_errors, 1, "the raised error counts");
    let r = s
        .exec("llm_query_batched(['a', 'b'], model='nope')")
        .expect("kernel works");
    assert_eq!(r.error.expect("raised").type_name, "LlmQueryError");
    assert_eq!(r.sub_call_errors, 2, "each prompt of the batch");
}

#[test]
fn budget_stop_is_a_clear_error_in_python() {
    let mock = Mock::start(
        MockConfig::default(),
        Budget {
            max_calls: Some(2),
            ..Budget::default()
        },
    );
    let s = session_on(&mock, SessionConfig::default());
    let r = ok(&s, "print([llm_query(f'q{i}') for i in range(3)])");
    assert!(r.stdout.contains("'q0', 'q1', 'Error: "), "{}", r.stdout);
    assert!(r.stdout.to_lowercase().contains("budget"), "{}", r.stdout);
    assert_eq!(mock.server.log().len(), 2);
}

#[test]
fn eight_python_threads_calling_llm_query_overlap() {
    let latency = Latency::fixed(Duration::from_millis(200));
    let mock = Mock::start(
        MockConfig {
            latency,
            ..MockConfig::default()
        },
        Budget::default(),
    );
    let s = session_on(&mock, SessionConfig::default());
    let r = ok(
        &s,
        "import threading\nout = [None] * 8\n\
         def work(i):\n    out[i] = llm_query(f'thread {i}')\n\
         threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]\n\
         for t in threads: t.start()\nfor t in threads: t.join()\nprint(out == [f'thread {i}' for i in range(8)])",
    );
    assert_eq!(r.stdout, "True\n");
    assert_eq!(r.llm_query_calls, 8);
    assert!(
        mock.server.log().max_concurrency() >= 8,
        "{}",
        mock.server.log().max_concurrency()
    );
}

#[test]
fn timeout_cancels_in_flight_sub_calls() {
    let latency = Latency::fixed(Duration::from_secs(30));
    let mock = Mock::start(
        MockConfig {
            latency,
            ..MockConfig::default()
        },
        Budget::default(),
    );
    let limit = Duration::from_millis(500);
    let s = session_on(
        &mock,
        SessionConfig {
            cell_timeout: limit,
            ..SessionConfig::default()
        },
    );
    for code in [
        "llm_query('slow')",
        "llm_query_batched(['a', 'b', 'c'])",
        "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(4) as pool:\n    list(pool.map(llm_query, ['a', 'b', 'c', 'd']))",
    ] {
        let started = Instant::now();
        let r = s.exec(code).expect("kernel works");
        let elapsed = started.elapsed();
        assert!(r.timed_out, "{code}: {r:?}");
        // The sub-calls take 30 s, so finishing well before that proves they were cancelled;
        // the slack is loose because a loaded machine delays the watchdog.
        assert!(
            elapsed < limit + Duration::from_secs(5),
            "{code}: {elapsed:?}"
        );
    }
    assert_eq!(ok(&s, "1 + 1").stdout, "2\n");
}
