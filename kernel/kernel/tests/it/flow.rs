//! The kernel's workflow agents end to end: a real REPL session, the mock LM server, the
//! engine's executor and event log.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use bridge::CancellationToken;
use bridge::mock::{FaultKind, FaultRule, Faults, MockConfig, MockServer, Script};
use bridge::{Budget, EndpointConfig, Endpoints, Ledger, RetryPolicy};
use engine::flow::Registry;
use engine::flow::file::{ConfigError, load_workflow};
use engine::flow::{
    Agent, EndStatus, Event, EventKind, EventLog, FlowError, Graph, Invocation, MemorySink,
    RunReport, run_workflow,
};
use engine::{SharedState, State, StateDelta, StateWrite, ToolContext};
use kernel::flow::{
    ContextLoader, FlowKernel, FunctionKind, PyFunction, PythonAgent, RlmAgent, register,
};
use kernel::repl::{ContextSource, ReplSession, SessionConfig};
use kernel::rlm::RlmConfig;
use serde_json::{Map, Value, json};

pub(crate) struct Setup {
    pub(crate) server: MockServer,
    kernel: Arc<FlowKernel>,
    pub(crate) dir: tempfile::TempDir,
}

pub(crate) fn setup(script: Value, contexts: Vec<ContextSource>) -> Setup {
    let script = Script::from_json_value(script).expect("valid script");
    setup_with(
        MockConfig {
            script,
            record_requests: true,
            ..MockConfig::default()
        },
        contexts,
    )
}

/// [`setup`] with the mock server configured as `config` says (faults, say).
fn setup_with(config: MockConfig, contexts: Vec<ContextSource>) -> Setup {
    let server = kernel::runtime::shared()
        .block_on(MockServer::start(config))
        .expect("mock server starts");
    let endpoint = |name: &str| EndpointConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        timeout: Duration::from_secs(20),
        ..EndpointConfig::openai(name, server.openai_base_url(), name)
    };
    let endpoints = Arc::new(
        Endpoints::new(
            vec![endpoint("root"), endpoint("sub")],
            Arc::new(Ledger::new(Budget::default())),
        )
        .expect("endpoints"),
    );
    let kernel = Arc::new(FlowKernel::new(
        endpoints,
        SessionConfig {
            cell_timeout: Duration::from_secs(20),
            ..SessionConfig::default()
        },
        contexts.into_iter().map(Into::into).collect(),
    ));
    Setup {
        server,
        kernel,
        dir: tempfile::tempdir().expect("temp dir"),
    }
}

impl Setup {
    /// Runs `root` over `state` with an event log in the temp dir; returns the report and
    /// the events read back from the log.
    pub(crate) fn run(&self, root: &dyn Agent, state: State) -> (RunReport, Vec<Event>) {
        let log_path = self.dir.path().join("events.jsonl");
        let log = Arc::new(EventLog::create(&log_path).expect("log"));
        let invocation = Invocation::new(SharedState::new(state))
            .with_ledger(Arc::clone(self.kernel.endpoints().ledger()))
            .with_sink(log);
        let report = kernel::runtime::shared().block_on(run_workflow(root, invocation, None));
        (report, EventLog::read(&log_path).expect("log reads back"))
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    /// The agent tree of the workflow file at `path`, with the kernel's classes registered.
    pub(crate) fn build(&self, path: &std::path::Path) -> Result<Arc<dyn Agent>, ConfigError> {
        let spec = load_workflow(path)?;
        let registry = Registry::new(Arc::clone(self.kernel.endpoints()), "root");
        register(registry, &self.kernel, self.dir.path()).build(&spec)
    }

    fn python(&self, name: &str, reference: &str) -> PythonAgent {
        let function = PyFunction::parse(reference, self.dir.path()).expect("reference");
        PythonAgent::new(name, function, Map::new(), Arc::clone(&self.kernel))
    }
}

fn state(pairs: &[(&str, Value)]) -> State {
    let mut state = State::default();
    for (k, v) in pairs {
        state.set(*k, v.clone());
    }
    state
}

/// `(author, kind)` of every start/end event, in order.
fn starts(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::Start)
        .map(|e| e.author.clone())
        .collect()
}

fn metadata<'a>(events: &'a [Event], topic: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Metadata { topic: t } if t == topic))
        .collect()
}

const SECRET_ROW: &str = "north,9917,quarterly-figure-zz";

#[test]
fn a_context_loader_then_an_rlm_agent_answers_a_templated_query_into_its_output_key() {
    let script = json!({"models": {
        "root": {"rules": [{
            "last_user": "(?s)Which region sold (?P<n>\\d+)",
            "reply": {"text": "```repl\nrows = [l.split(',') for l in context.splitlines()]\nregion = [r[0] for r in rows if r[1] == '{{n}}'][0]\nprint(llm_query('say ok'))\n```"}
        }, {
            "last_user": "(?s)ok",
            "reply": {"text": "FINAL_VAR(region)"}
        }]},
        "sub": {"fallback": {"text": "ok"}}
    }});
    let s = setup(script, Vec::new());
    let csv = s.write(
        "sales.txt",
        &format!("region,units,note\n{SECRET_ROW}\nsouth,12,x\n"),
    );
    let loader = ContextLoader::new("load", Arc::clone(&s.kernel)).with_paths_key("paths");
    let rlm = RlmAgent::new(
        "analyst",
        "Which region sold {units}? {hint?}",
        RlmConfig {
            max_iterations: 4,
            ..RlmConfig::default()
        },
        Arc::clone(&s.kernel),
    )
    .with_output_key("region");
    let flow =
        Graph::sequential("pipeline", vec![Arc::new(loader), Arc::new(rlm)]).expect("two nodes");
    let (report, events) = s.run(
        &flow,
        state(&[("units", json!(9917)), ("paths", json!([csv]))]),
    );
    assert_eq!(report.result, Ok(engine::flow::Control::Continue));
    assert_eq!(report.state.get("region"), Some(&json!("north")));
    let contexts = report.state.get("contexts").expect("metadata written");
    assert_eq!(contexts[0]["kind"], json!("text"), "{contexts}");
    assert_eq!(starts(&events), ["pipeline", "load", "analyst"]);
    let iterations = metadata(&events, "rlm_iteration");
    assert_eq!(iterations.len(), 2);
    assert_eq!(
        iterations[0].metadata["iteration"]["llm_query_calls"],
        json!(1)
    );
    // Each iteration shows its code blocks and what they printed.
    let block = &iterations[0].metadata["blocks"][0];
    assert!(
        block["code"]
            .as_str()
            .is_some_and(|code| code.contains("print(llm_query('say ok'))")),
        "{block}"
    );
    assert_eq!(block["stdout"], json!("ok\n"), "{block}");
    assert_eq!(metadata(&events, "rlm_sub_call").len(), 1);
    let result = metadata(&events, "rlm_result");
    assert_eq!(
        result[0].metadata["termination_reason"],
        json!("final_answer")
    );
    let answer = events
        .iter()
        .find(|e| e.author == "analyst" && e.kind == EventKind::Message)
        .expect("the answer is a message");
    assert_eq!(answer.content.as_deref(), Some("north"));
    let log = std::fs::read_to_string(s.dir.path().join("events.jsonl")).expect("log");
    assert!(
        !log.contains("quarterly-figure-zz"),
        "no context data in the log"
    );
}

#[test]
fn an_rlm_agent_names_a_missing_state_key_and_an_unknown_model() {
    let s = setup(json!({"models": {}}), vec![ContextSource::Text("x".into())]);
    let rlm = RlmAgent::new(
        "a",
        "About {topic}",
        RlmConfig::default(),
        Arc::clone(&s.kernel),
    );
    let (report, _) = s.run(&rlm, State::default());
    let Err(FlowError::Agent { agent, message }) = report.result else {
        panic!("{:?}", report.result)
    };
    assert_eq!(agent, "a");
    assert!(message.contains("`topic`"), "{message}");

    // A root endpoint that is not configured: the loop cannot start.
    let config = RlmConfig {
        root_endpoint: "nowhere".into(),
        ..RlmConfig::default()
    };
    let rlm = RlmAgent::new("a", "About {topic}", config, Arc::clone(&s.kernel));
    let (report, events) = s.run(&rlm, state(&[("topic", json!("t"))]));
    let Err(FlowError::Agent { message, .. }) = report.result else {
        panic!("{:?}", report.result)
    };
    assert!(message.contains("`nowhere`"), "{message}");
    assert_eq!(
        events.last().and_then(Event::end_status),
        Some(EndStatus::Failed)
    );
}

#[test]
fn python_steps_update_the_state_that_the_next_step_and_iteration_see_and_exit_a_loop() {
    let s = setup(
        json!({"models": {}}),
        vec![ContextSource::Text("abc".into())],
    );
    s.write(
        "steps.py",
        "def count(state, step=1):\n    n = state.get('n', 0) + step\n    out = {'n': n, 'seen': len(context)}\n    if n >= 6:\n        out['__actions__'] = ['exit_loop']\n    return out\n\n\
         def double(state):\n    return {'doubled': state['n'] * 2, '__message__': 'doubled'}\n",
    );
    let function = PyFunction::parse("steps.py:count", s.dir.path()).expect("file reference");
    let mut kwargs = Map::new();
    kwargs.insert("step".into(), json!(2));
    let count = PythonAgent::new("count", function, kwargs, Arc::clone(&s.kernel));
    let double = s.python("double", "steps:double");
    let max = NonZeroU32::new(10).expect("not zero");
    let flow =
        Graph::looping("loop", vec![Arc::new(count), Arc::new(double)], max).expect("two nodes");
    let (report, events) = s.run(&flow, State::default());
    assert_eq!(report.result, Ok(engine::flow::Control::Continue));
    assert_eq!(report.state.get("n"), Some(&json!(6)));
    assert_eq!(
        report.state.get("seen"),
        Some(&json!(3)),
        "the step sees the context"
    );
    // `double` ran after each of the first two counts only (the third exited the loop).
    assert_eq!(report.state.get("doubled"), Some(&json!(8)));
    assert_eq!(
        starts(&events),
        ["loop", "count", "double", "count", "double", "count"]
    );
    let said: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::Message)
        .collect();
    assert_eq!(said.len(), 2);
    assert_eq!(
        (said[0].author.as_str(), said[0].content.as_deref()),
        ("double", Some("doubled"))
    );
    let loop_end = events.last().expect("events");
    assert_eq!(loop_end.end_status(), Some(EndStatus::ExitedLoop));
    // Nothing of the call is left in the session's namespace.
    let session = s.kernel.session().expect("session");
    let vars = session.variables().expect("variables");
    assert!(
        vars.iter().all(|v| !v.name.starts_with("__rlm_flow")),
        "{vars:?}"
    );
}

/// A Python step's call leaves no copy of the state it got behind: the state is a literal
/// in the block that calls the step, and a session keeps a block's source (in `linecache`,
/// and its definitions for spawn workers) — per step, a run's memory grew with the square
/// of its steps (a 1 000-step routed `rlm flow run`: 570 MB).
#[test]
fn python_steps_leave_no_copy_of_the_state_in_the_session() {
    let s = setup(json!({"models": {}}), vec![]);
    s.write(
        "steps.py",
        "def grow(ctx):\n    n = ctx.state.get('n', 0) + 1\n    ctx.state['n'] = n\n    \
         if n >= 20:\n        ctx.actions.exit_loop = True\n",
    );
    let step = s.python("grow", "steps.py:grow");
    let max = NonZeroU32::new(30).expect("not zero");
    let flow = Graph::looping("loop", vec![Arc::new(step)], max).expect("one node");
    let blob = "MARKER-of-the-state ".repeat(500);
    let (report, _) = s.run(&flow, state(&[("blob", json!(blob))]));
    assert_eq!(
        report.state.get("n"),
        Some(&json!(20)),
        "{:?}",
        report.result
    );
    let session = s.kernel.session().expect("session");
    // The marker is built at run time, so this block's own source does not hold it.
    let found = session
        .exec(
            "import linecache as _lc, threading as _th\n\
             _m = 'MARKER-of-' + 'the-state'\n\
             _kept = [sum(_m in ''.join(v[2]) for v in list(_lc.cache.values()) if len(v) > 2 and v[2]),\n\
             sum(_m in d[2] for d in _th.current_thread()._rlm_session.definitions)]\n\
             print(_kept)\n",
        )
        .expect("block runs");
    assert_eq!(found.error, None, "{found:?}");
    assert_eq!(
        found.stdout.trim(),
        "[0, 0]",
        "blocks kept with the state in them"
    );
}

/// The one convention of every Python function of a workflow, as Google ADK writes it: a
/// step's `ctx` and a callback's `callback_context` hold `state` (writes, deletes, in-place
/// appends) and `actions`; the effects come back as writes — a delete is a delete, an
/// appended item an append — and a context parameter under another kind's name is refused
/// with how to write it.
#[test]
fn steps_and_callbacks_report_writes_and_actions_through_their_context() {
    let s = setup(json!({"models": {}}), Vec::new());
    s.write(
        "steps.py",
        "def tick(ctx, by=1):\n    n = ctx.state.get('n', 0) + by\n    ctx.state['n'] = n\n    \
         ctx.state['log'].append(n)\n    if 'draft' in ctx.state:\n        del ctx.state['draft']\n    \
         ctx.state['note'] = None\n    if n >= 4:\n        ctx.actions.exit_loop = True\n    \
         return f'tick {n}'\n\n\
         def stamp(callback_context):\n    assert callback_context.point == 'before_agent'\n    \
         callback_context.state['stamped'] = callback_context.agent\n\n\
         def misnamed(tool_context):\n    return None\n\n\
         def returns_dict(ctx):\n    return {'n': 1}\n",
    );
    s.write(
        "tick.yaml",
        "agent_class: PythonAgent\nname: tick\nfunction: steps.py:tick\nargs: {by: 2}\n\
         before_agent_callbacks: [{name: steps.py:stamp}]\n",
    );
    let root = s.write(
        "loop.yaml",
        "agent_class: LoopAgent\nname: loop\nmax_iterations: 5\nsub_agents: [{config_path: tick.yaml}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let start = state(&[("log", json!([])), ("draft", json!("old"))]);
    let (report, events) = s.run(flow.as_ref(), start);
    assert_eq!(report.result, Ok(engine::flow::Control::Continue));
    assert_eq!(report.state.get("n"), Some(&json!(4)));
    assert_eq!(report.state.get("log"), Some(&json!([2, 4])));
    assert_eq!(report.state.get("draft"), None, "deleted, not set to null");
    assert_eq!(report.state.get("note"), Some(&Value::Null));
    assert_eq!(report.state.get("stamped"), Some(&json!("tick")));
    let said: Vec<&str> = events
        .iter()
        .filter(|e| e.author == "tick" && e.kind == EventKind::Message)
        .filter_map(|e| e.content.as_deref())
        .collect();
    assert_eq!(said, ["tick 2", "tick 4"]);
    let first = events
        .iter()
        .find(|e| e.author == "tick" && e.kind == EventKind::Message)
        .expect("the first tick");
    let writes: Vec<StateWrite> = first.delta.iter().cloned().collect();
    assert!(
        writes.contains(&StateWrite::Append {
            key: "log".into(),
            items: vec![json!(2)]
        }),
        "{writes:?}"
    );
    assert!(
        writes.contains(&StateWrite::Delete {
            key: "draft".into()
        }),
        "{writes:?}"
    );

    for (function, expected) in [
        (
            "steps.py:misnamed",
            "takes `tool_context`, but a step gets its context as `ctx`",
        ),
        (
            "steps.py:returns_dict",
            "returned a dict: such a step writes the state through `ctx.state`",
        ),
    ] {
        let (report, _) = s.run(&s.python("step", function), State::default());
        let Err(FlowError::Agent { message, .. }) = &report.result else {
            panic!("{function}: {:?}", report.result)
        };
        assert!(message.contains(expected), "{function}: {message}");
    }
}

#[test]
fn a_python_step_that_raises_or_returns_no_dict_fails_with_what_it_did() {
    let s = setup(json!({"models": {}}), Vec::new());
    s.write(
        "bad.py",
        "def boom(state):\n    raise ValueError('no plan yet')\n\ndef wrong(state):\n    return [1]\n\ndef odd(state):\n    return {'x': object()}\n",
    );
    for (function, expected) in [
        ("bad.py:boom", "ValueError: no plan yet"),
        (
            "bad.py:wrong",
            "returned a list, not a dict of state updates",
        ),
        ("bad.py:odd", "not JSON serializable"),
        ("bad.py:missing", "AttributeError"),
        ("no_such_module:f", "ModuleNotFoundError"),
    ] {
        let (report, _) = s.run(&s.python("step", function), State::default());
        let Err(FlowError::Agent { message, .. }) = &report.result else {
            panic!("{function}: {:?}", report.result)
        };
        assert!(message.contains(expected), "{function}: {message}");
    }
}

#[test]
fn python_callbacks_named_in_files_short_circuit_an_agent_and_a_root_model_call() {
    let s = setup(json!({"models": {}}), vec![ContextSource::Text("x".into())]);
    s.write(
        "hooks.py",
        "def cached(ctx):\n    ctx['state']['cache_hits'] = ctx['state'].get('cache_hits', 0) + 1\n    if ctx['args'] and ctx['args'].get('skip'):\n        return 'from cache'\n\n\
         def canned(ctx):\n    assert ctx['point'] == 'before_model'\n    assert ctx['request'][0]['role'] == 'system'\n    assert ctx['request'][-1]['content'].endswith(' REMINDER')\n    return 'FINAL(canned answer)'\n\n\
         def remind(ctx):\n    ctx['request'][-1]['content'] += ' REMINDER'\n\n\
         def shout(ctx):\n    return ctx['response'].upper()\n",
    );
    s.write(
        "never.yaml",
        "agent_class: PythonAgent\nname: never\nfunction: hooks:never_called\n\
         before_agent_callbacks:\n  - name: hooks.py:cached\n    args: {skip: true}\n",
    );
    s.write(
        "rlm.yaml",
        "agent_class: RlmAgent\nname: rlm\ninstruction: q\noutput_key: answer\n\
         before_agent_callbacks: [{name: hooks:cached}]\n\
         before_model_callbacks: [{name: hooks:cached}, {name: hooks:remind}, {name: hooks:canned}]\n\
         after_model_callbacks: [{name: hooks:shout}]\n",
    );
    let root = s.write(
        "both.yaml",
        "agent_class: SequentialAgent\nname: both\n\
         sub_agents: [{config_path: never.yaml}, {config_path: rlm.yaml}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let (report, events) = s.run(flow.as_ref(), State::default());
    assert_eq!(
        report.result,
        Ok(engine::flow::Control::Continue),
        "{events:#?}"
    );
    let skipped_end = events
        .iter()
        .find(|e| e.author == "never" && e.end_status().is_some())
        .expect("end");
    assert_eq!(skipped_end.end_status(), Some(EndStatus::Skipped));
    // The before_model callbacks changed the request and answered; the after_model one
    // changed the reply; no request reached the server.
    assert_eq!(report.state.get("answer"), Some(&json!("CANNED ANSWER")));
    assert!(s.server.log().is_empty());
    // before_agent of `never`, before_agent of `rlm`, before_model of `rlm`.
    assert_eq!(report.state.get("cache_hits"), Some(&json!(3)));
}

/// A Python `on_model_error` callback named in a file, against a mock server that answers
/// `root` with 500 and `sub` with a body that is not JSON: one that returns text recovers
/// the step (the text is the reply), one that returns None lets the error through and the
/// run fails with the server's error named.
#[test]
fn a_python_on_model_error_callback_recovers_a_step_or_lets_the_error_through() {
    let faults = Faults {
        rules: vec![
            FaultRule {
                last_user: None,
                model: Some("^root$".into()),
                fault: FaultKind::ServerError,
                times: None,
            },
            FaultRule {
                last_user: None,
                model: Some("^sub$".into()),
                fault: FaultKind::MalformedJson,
                times: None,
            },
        ],
        ..Faults::default()
    };
    let s = setup_with(
        MockConfig {
            faults,
            ..MockConfig::default()
        },
        Vec::new(),
    );
    s.write(
        "hooks.py",
        "def recover(ctx):\n    assert ctx['point'] == 'on_model_error'\n    \
         ctx['state']['errors'] = ctx['state'].get('errors', []) + [ctx['error']]\n    \
         return 'drafted offline by ' + ctx['agent']\n\n\
         def give_up(ctx):\n    ctx['state']['gave_up'] = True\n",
    );
    let writer = |name: &str, model: &str, callback: &str| {
        s.write(
            &format!("{name}.yaml"),
            &format!(
                "name: {name}\nmodel: {model}\ninstruction: Write the draft.\n\
                 output_key: {name}_draft\n\
                 on_model_error_callbacks: [{{name: hooks.py:{callback}}}]\n"
            ),
        )
    };
    for (name, model) in [("on_500", "root"), ("on_garbage", "sub")] {
        let flow = s.build(&writer(name, model, "recover")).expect("builds");
        let (report, events) = s.run(flow.as_ref(), State::default());
        assert_eq!(
            report.result,
            Ok(engine::flow::Control::Continue),
            "{name}: {events:#?}"
        );
        assert_eq!(
            report.state.get(&format!("{name}_draft")),
            Some(&json!(format!("drafted offline by {name}"))),
            "{name}: the callback's text is the reply"
        );
        let errors = report
            .state
            .get("errors")
            .and_then(Value::as_array)
            .cloned();
        let error = errors.and_then(|e| e.first().cloned()).unwrap_or_default();
        assert!(
            error.as_str().is_some_and(|e| !e.is_empty()),
            "{name}: the callback saw the error: {error}"
        );
    }

    let flow = s
        .build(&writer("stuck", "root", "give_up"))
        .expect("builds");
    let (report, _) = s.run(flow.as_ref(), State::default());
    let Err(FlowError::Model { agent, source }) = &report.result else {
        panic!("the server's error stands: {:?}", report.result)
    };
    assert_eq!(agent, "stuck");
    assert!(
        matches!(**source, bridge::BridgeError::Http { status: 500, .. }),
        "{source}"
    );
    let message = report.result.as_ref().err().map(ToString::to_string);
    assert!(
        message.as_deref().is_some_and(|m| m.contains("500")),
        "the message names the server's error: {message:?}"
    );
    assert_eq!(report.state.get("gave_up"), Some(&json!(true)));
    assert_eq!(report.state.get("stuck_draft"), None);
}

/// Cancels the run at the first model call.
struct CancelBeforeModel(bridge::CancellationToken);

impl engine::flow::Callback for CancelBeforeModel {
    fn before_model(
        &self,
        _ctx: &engine::flow::CallbackContext,
        _request: &mut bridge::ChatRequest,
    ) -> engine::HookAction<bridge::ChatResponse> {
        self.0.cancel();
        engine::HookAction::Continue
    }
}

#[test]
fn cancelling_a_run_stops_the_rlm_loop_and_keeps_the_event_log() {
    let script = json!({"models": {"root": {
        "fallback": {"text": "```repl\nprint(1)\n```"},
        "latency": {"kind": "fixed", "ms": 10_000}
    }}});
    let s = setup(script, vec![ContextSource::Text("x".into())]);
    let rlm = RlmAgent::new("slow", "q", RlmConfig::default(), Arc::clone(&s.kernel));
    let memory = Arc::new(MemorySink::new());
    let mut invocation =
        Invocation::new(SharedState::new(State::default())).with_sink(memory.clone());
    // Cancel the run (as Ctrl-C does) once the root call is about to be sent.
    invocation
        .callbacks
        .push(Arc::new(CancelBeforeModel(invocation.cancel.clone())));
    let report = kernel::runtime::shared().block_on(run_workflow(&rlm, invocation, None));
    assert_eq!(report.result, Err(FlowError::Cancelled));
    let events = memory.events();
    assert_eq!(
        events.first().map(|e| e.kind.clone()),
        Some(EventKind::Start)
    );
    // The loop was stopped (it reports `interrupted` instead of the root model's reply,
    // which would take 10 s), and the step waited for it: its record comes before the
    // step's `End`, which is the log's last line.
    let results = metadata(&events, "rlm_result");
    assert_eq!(results.len(), 1, "{events:#?}");
    assert_eq!(
        results[0].metadata["termination_reason"],
        json!("interrupted")
    );
    let last = events.last();
    assert_eq!(last.and_then(Event::end_status), Some(EndStatus::Cancelled));
    assert_eq!(last.map(|e| e.author.as_str()), Some("slow"));
    assert!(results[0].seq < last.map_or(0, |e| e.seq));
    // Nothing of the loop comes later.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(memory.events().len(), events.len());
}

#[test]
fn workflow_files_build_kernel_agents_and_point_at_bad_lines() {
    let script = json!({"models": {"root": {"fallback": {"text": "FINAL(2)"}}}});
    let s = setup(script, Vec::new());
    let notes = s.write("notes.txt", "alpha\nbeta\n");
    s.write(
        "hooks.py",
        "def mark(ctx, **_):\n    ctx['state']['marked'] = ctx['args']['tag']\n",
    );
    s.write(
        "load.yaml",
        "agent_class: PythonAgent\nname: load\nfunction: rlm:load_contexts\n\
         args: {paths_key: files, output_key: loaded}\n",
    );
    s.write(
        "ask.yaml",
        "agent_class: RlmAgent\nname: ask\nmodel: root\ninstruction: Count {what}\n\
         output_key: count\nmax_iterations: 2\nargs: {run_timeout: 30}\n\
         before_agent_callbacks:\n  - name: hooks.py:mark\n    args: {tag: seen}\n",
    );
    let root = s.write(
        "flow.yaml",
        "agent_class: SequentialAgent\nname: flow\n\
         sub_agents: [{config_path: load.yaml}, {config_path: ask.yaml}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let (report, _) = s.run(
        flow.as_ref(),
        state(&[("files", json!([notes])), ("what", json!("lines"))]),
    );
    assert_eq!(report.result, Ok(engine::flow::Control::Continue));
    assert_eq!(report.state.get("marked"), Some(&json!("seen")));
    assert!(report.state.get("loaded").is_some_and(Value::is_array));
    assert_eq!(report.state.get("count"), Some(&json!("2")));

    for (text, expected) in [
        (
            "agent_class: RlmAgent\nname: a\ninstruction: q\nmodel: nope\n",
            ":4:1: There is no model `nope`",
        ),
        (
            "agent_class: RlmAgent\nname: a\ninstruction: q\nsub_model: nope\n",
            ":4:1: There is no model `nope`",
        ),
        (
            "agent_class: RlmAgent\nname: a\ninstruction: q\nargs: {cell: 3}\n",
            ":4:1: unknown field `cell`",
        ),
        (
            "agent_class: PythonAgent\nname: a\nfunction: not a function\n",
            ":3:1: `not a function` does not name a Python function",
        ),
        (
            "agent_class: PythonAgent\nname: a\nfunction: m:f\n\
             after_agent_callbacks:\n  - name: nofunction\n",
            ":5:5: `nofunction` does not name a Python function",
        ),
    ] {
        let path = s.write("bad.yaml", text);
        let err = s.build(&path).expect_err("refused").to_string();
        assert!(err.contains(expected), "{err}");
    }
}

/// A router whose gate and successor tests are Python functions in the run's REPL: the gate
/// blocks (with its reason) until the fixer ran, a test that raises does not hold (no
/// crash), and the review loop ends when `approved` says so.
#[test]
fn python_gates_and_conditions_route_a_router_built_from_files() {
    let s = setup(json!({"models": {}}), Vec::new());
    s.write(
        "checks.py",
        "def draft(state):\n    tests = ' and tests' if state.get('advice') else ''\n    return {'drafts': state.get('drafts', 0) + 1, 'code': 'code' + tests}\n\n\
         def fix(state):\n    return {'advice': 'add tests'}\n\n\
         def review(state):\n    return {'reviews': state.get('reviews', 0) + 1}\n\n\
         def has_tests(state):\n    if 'tests' in state.get('code', ''):\n        return True\n    return {'passed': False, 'reason': 'the code has no tests'}\n\n\
         def approved(state):\n    return state.get('reviews', 0) >= 2\n\n\
         def boom(state):\n    raise RuntimeError('no verdict')\n",
    );
    for name in ["draft", "fix", "review"] {
        s.write(
            &format!("{name}.yaml"),
            &format!("agent_class: PythonAgent\nname: {name}\nfunction: checks.py:{name}\n"),
        );
    }
    let root = s.write(
        "team.yaml",
        "agent_class: RouterAgent
name: team
start: draft
sub_agents:
  - config_path: draft.yaml
    gates:
      - {name: has_tests, python: checks.py:has_tests}
  - config_path: fix.yaml
  - config_path: review.yaml
successors:
  draft: review
  fix: draft
  review:
    - {when: {python: checks.py:boom}, to: fix}
    - {when: {python: checks.py:approved}, to: END}
    - to: draft
recovery:
  has_tests: fix
",
    );
    let agent = s.build(&root).expect("builds");
    let (report, events) = s.run(agent.as_ref(), State::default());
    assert!(report.result.is_ok(), "{:?}", report.result);
    assert_eq!(
        starts(&events),
        ["team", "draft", "fix", "draft", "review", "draft", "review"]
    );
    let decisions = report.state.get("decisions").expect("decisions");
    let summaries: Vec<&str> = decisions
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|d| d["summary"].as_str())
        .collect();
    assert_eq!(
        summaries,
        [
            "draft → fix",
            "fix → draft",
            "draft → review",
            "review → draft",
            "draft → review",
            "review → end"
        ]
    );
    assert_eq!(
        decisions[0]["rationale"],
        json!("Gate `has_tests` is blocked (the code has no tests); its recovery node takes over")
    );
    assert_eq!(report.state.get("reviews"), Some(&json!(2)));

    // A `python` name that is no function reference is refused at its line.
    let bad = s.write(
        "bad.yaml",
        "agent_class: RouterAgent\nname: bad\nstart: draft\nsub_agents:\n  - config_path: draft.yaml\n    gates:\n      - {name: g, python: not a function}\n",
    );
    let err = s.build(&bad).map(|_| ()).expect_err("a bad reference");
    assert!(
        err.to_string()
            .contains("bad.yaml:7:19: `not a function` does not name a Python function"),
        "{err}"
    );
}

/// The result of every tool call, by tool name, in order.
pub(crate) fn tool_results(events: &[Event]) -> Vec<(String, Value)> {
    events
        .iter()
        .flat_map(|e| e.tool_results.iter())
        .map(|r| (r.name.clone(), r.result.clone()))
        .collect()
}

#[test]
fn python_functions_are_tools_and_python_callbacks_act_at_every_tool_point() {
    let script = json!({"models": {"root": {"replies": [
        {"tool_calls": [
            {"name": "lookup", "arguments": {"region": "north"}},
            {"name": "broken", "arguments": {}},
            {"name": "forbidden", "arguments": {}},
        ]},
        {"tool_calls": [{"name": "lookup", "arguments": {"region": "south"}}]},
        "Two regions looked up.",
    ]}}});
    let s = setup(script, Vec::new());
    s.write(
        "tools.py",
        "def lookup(region, tool_context):\n    seen = tool_context.state.get('seen', [])\n    \
         tool_context.state['seen'] = seen + [region]\n    \
         return {'region': region, 'sales': len(seen) + 1}\n\n\
         def broken():\n    raise ValueError('no data today')\n\n\
         def forbidden(tool_context):\n    tool_context.state['forbidden_ran'] = True\n    return 'ran'\n",
    );
    s.write(
        "hooks.py",
        "def block(ctx):\n    assert ctx['point'] == 'before_tool'\n    \
         if ctx['tool']['name'] == 'forbidden':\n        \
         ctx['state']['blocked'] = ctx['tool']['name']\n        \
         return {'blocked': True}\n\n\
         def stamp(ctx):\n    if ctx['tool']['name'] == 'lookup':\n        \
         return dict(ctx['result'], checked=ctx['state']['seen'][-1])\n\n\
         def recover(ctx):\n    return {'recovered': ctx['error'].splitlines()[-1]}\n\n\
         def sign(ctx):\n    return 'Signed by ' + ctx['agent']\n",
    );
    let root = s.write(
        "analyst.yaml",
        "name: analyst\nmodel: root\ninstruction: Look the regions up.\noutput_key: answer\n\
         tools:\n\
         \x20 - name: tools.py:lookup\n\
         \x20   args:\n\
         \x20     description: Sales of a region.\n\
         \x20     parameters: {type: object, properties: {region: {type: string}}, required: [region]}\n\
         \x20 - name: tools.py:broken\n\
         \x20 - name: tools.py:forbidden\n\
         before_tool_callbacks: [{name: hooks.py:block}]\n\
         after_tool_callbacks: [{name: hooks.py:stamp}]\n\
         on_tool_error_callbacks: [{name: hooks.py:recover}]\n\
         after_agent_callbacks: [{name: hooks.py:sign}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let (report, events) = s.run(flow.as_ref(), State::default());
    assert_eq!(
        report.result,
        Ok(engine::flow::Control::Continue),
        "{events:#?}"
    );
    // The tool's writes reached the next call of it and the state.
    assert_eq!(report.state.get("seen"), Some(&json!(["north", "south"])));
    // before_tool blocked `forbidden` (it never ran), after_tool amended each result,
    // on_tool_error recovered from the exception with its own result.
    assert_eq!(report.state.get("forbidden_ran"), None);
    assert_eq!(report.state.get("blocked"), Some(&json!("forbidden")));
    assert_eq!(
        tool_results(&events),
        [
            (
                "lookup".to_owned(),
                json!({"region": "north", "sales": 1, "checked": "north"})
            ),
            (
                "broken".to_owned(),
                json!({"recovered": "ValueError: no data today"})
            ),
            ("forbidden".to_owned(), json!({"blocked": true})),
            (
                "lookup".to_owned(),
                json!({"region": "south", "sales": 2, "checked": "south"})
            ),
        ]
    );
    assert_eq!(
        report.state.get("answer"),
        Some(&json!("Two regions looked up."))
    );
    // after_agent added the agent's last message.
    let last = events
        .iter()
        .rfind(|e| e.author == "analyst" && e.kind == EventKind::Message)
        .and_then(|e| e.content.clone());
    assert_eq!(last.as_deref(), Some("Signed by analyst"));

    for (text, expected) in [
        (
            "name: a\nmodel: root\ntools:\n  - name: lookup\n",
            ":4:5: There is no tool `lookup`; known tools: `exit_loop`, `end_turn`, `escalate`, \
             `AgentTool`, or a Python function (`module:function`, `file.py:function`)",
        ),
        (
            "name: a\nmodel: root\ntools:\n  - name: tools.py:lookup\n    args: {desc: x}\n",
            ":4:5: unknown field `desc`",
        ),
        (
            "name: a\nmodel: root\ntools:\n  - name: tools.py:lookup\n    \
             args: {parameters: {type: string}}\n",
            "must be a JSON Schema of `type: object`",
        ),
    ] {
        let path = s.write("bad.yaml", text);
        let err = s.build(&path).expect_err("refused").to_string();
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn concurrent_python_steps_each_get_their_own_result() {
    let s = setup(json!({"models": {}}), Vec::new());
    s.write(
        "steps.py",
        "import time\n\ndef step(state, key):\n    time.sleep(0.001)\n    return {key: key.upper()}\n",
    );
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        s.write(
            &format!("s{i}.yaml"),
            &format!("agent_class: PythonAgent\nname: s{i}\nfunction: steps.py:step\nargs: {{key: {key}}}\n"),
        );
    }
    let subs: String = (0..8)
        .map(|i| format!("  - config_path: s{i}.yaml\n"))
        .collect();
    s.write(
        "fan.yaml",
        &format!("agent_class: ParallelAgent\nname: fan\nsub_agents:\n{subs}"),
    );
    let root = s.write(
        "root.yaml",
        "agent_class: LoopAgent\nname: root\nmax_iterations: 10\nsub_agents: [{config_path: fan.yaml}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let (report, events) = s.run(flow.as_ref(), State::default());
    assert_eq!(report.result, Ok(engine::flow::Control::Continue));
    // Every run of step `sN` wrote its own key `kN` only.
    let mut writes = 0;
    let steps = events
        .iter()
        .filter(|e| e.kind == EventKind::StateUpdate && e.author != "fan");
    for event in steps {
        let own = format!("k{}", &event.author[1..]);
        assert_eq!(event.delta.keys(), [own.as_str()], "{}", event.author);
        writes += 1;
    }
    assert_eq!(writes, 80);
    for key in &keys {
        assert_eq!(
            report.state.get(key),
            Some(&json!(key.to_uppercase())),
            "{key}"
        );
    }
}

/// What a Python call sends its session does not grow with the run: the session keeps the
/// state and gets only the writes made since it last saw it, whoever made them — and the
/// function still sees exactly the engine's state (the same dict, its keys in the same
/// order) in each form: a step taking `ctx` or the state as a dict, a callback taking
/// `callback_context` or one `ctx` dict. What a function changes in place in what it got
/// never reaches the kept copy; an interrupted call leaves it whole; a second session, and
/// the first one again after it, get the whole state once.
#[test]
fn a_python_call_gets_the_writes_since_its_session_last_saw_the_state_not_the_whole_state() {
    let s = setup(json!({"models": {}}), Vec::new());
    s.write(
        "view.py",
        "import json, time\n\n\
         def view(d):\n    return json.dumps(d, separators=(',', ':'), ensure_ascii=False)\n\n\
         def ctx_step(ctx):\n    seen = view(ctx.state.to_dict())\n    \
         ctx.state['messages'].append('LEAK')\n    ctx.state['messages'][0] = 'LEAK'\n    \
         ctx.state['count'] = -1\n    return seen\n\n\
         def dict_step(state):\n    seen = view(state)\n    state['messages'].append('LEAK')\n    \
         state['decisions'][0]['to'] = 'LEAK'\n    state.pop('count', None)\n    \
         return {'__message__': seen}\n\n\
         def dict_callback(ctx):\n    seen = view(ctx['state'])\n    \
         ctx['state']['messages'].append('LEAK')\n    ctx['state'].clear()\n    return seen\n\n\
         def ctx_callback(callback_context):\n    seen = view(dict(callback_context.state))\n    \
         callback_context.state['messages'][0] = 'LEAK'\n    return seen\n\n\
         def sleepy(ctx):\n    ctx.state['messages'].append('LEAK')\n    time.sleep(30)\n",
    );
    let function = |name: &str| {
        PyFunction::parse(&format!("view.py:{name}"), s.dir.path()).expect("reference")
    };
    let callback = json!({
        "point": "before_agent", "agent": "a", "branch": "", "args": null,
        "actions": {"exit_loop": false, "end_turn": false, "escalate": false},
    });
    let forms = [
        (function("ctx_step"), FunctionKind::Step, Value::Null),
        (function("dict_step"), FunctionKind::Step, Value::Null),
        (
            function("dict_callback"),
            FunctionKind::Callback,
            callback.clone(),
        ),
        (function("ctx_callback"), FunctionKind::Callback, callback),
    ];
    let first = s.kernel.session().expect("session");
    let second = Arc::new(
        ReplSession::new(
            SessionConfig::default(),
            Arc::clone(s.kernel.endpoints()),
            &[],
        )
        .expect("a second session"),
    );
    let shared = SharedState::new(State::default());
    let others = ToolContext::new("others", shared.clone());
    let long = "x".repeat(1_000);
    let mut sent = Vec::new();
    for i in 0..40 {
        // What the others wrote since the last call: a router's decision, another agent's
        // message, a replaced key, a new key (which sorts among the others) and a delete.
        let mut writes = vec![
            StateWrite::Append {
                key: "messages".into(),
                items: vec![json!(format!("{i} {long}"))],
            },
            StateWrite::Append {
                key: "decisions".into(),
                items: vec![json!({"step": i, "to": "b"})],
            },
            StateWrite::Replace {
                key: "count".into(),
                value: json!(i),
            },
            StateWrite::Replace {
                key: format!("k{:02}", 40 - i).into(),
                value: json!([i]),
            },
        ];
        if i > 0 {
            writes.push(StateWrite::Delete {
                key: format!("k{:02}", 41 - i).into(),
            });
        }
        others.apply(StateDelta::from(writes));
        if i == 20 {
            // A call interrupted while its function runs: the run goes on.
            let stop = CancellationToken::new();
            let (cancel, session) = (stop.clone(), Arc::clone(&first));
            let stopper = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                cancel.cancel();
                session.check_stop();
            });
            let called = function("sleepy").call(
                &first,
                FunctionKind::Step,
                &Value::Null,
                Some(&shared),
                &Map::new(),
                &stop,
            );
            stopper.join().expect("stopper");
            assert!(called.is_err(), "{called:?}");
        }
        // Calls 30 to 34 in another session, then the first one again.
        let session = if (30..35).contains(&i) {
            &second
        } else {
            &first
        };
        let (function, kind, arg) = &forms[i % forms.len()];
        let called = function
            .call(
                session,
                *kind,
                arg,
                Some(&shared),
                &Map::new(),
                &CancellationToken::new(),
            )
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        let state = shared.with(|state| serde_json::to_string(state).expect("JSON"));
        assert_eq!(called.value, json!(state), "call {i} saw another state");
        sent.push((called.sent, state.len()));
    }
    let (_, size) = sent[39];
    assert!(size > 40_000, "{size}");
    for (i, &(bytes, state)) in sent.iter().enumerate() {
        if [0, 30, 35].contains(&i) {
            assert!(
                bytes > state,
                "call {i} got the whole state: {bytes} of {state}"
            );
        } else {
            assert!(
                bytes < 4_000,
                "call {i} sent {bytes} bytes with a state of {state}"
            );
        }
    }
}
