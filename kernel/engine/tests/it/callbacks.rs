//! Agent callbacks: observe, change or short-circuit an agent run.

use std::sync::{Arc, Mutex};

use engine::HookAction;
use engine::flow::{
    Callback, CallbackContext, Callbacks, Control, EndStatus, EventKind, FnAgent, Graph,
    Invocation, RunOutcome,
};
use engine::{SharedState, State};
use serde_json::json;

use crate::support::{ends, run, run_with, step, trace, traced, written};

/// Answers from the cache instead of running the agent when `cache:<agent>` is set.
struct Cache;

impl Callback for Cache {
    fn before_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        match ctx.get_state(&format!("cache:{}", ctx.agent())) {
            Some(answer) => {
                ctx.set_state("cache_hits", json!(1));
                HookAction::Replace(answer.as_str().unwrap_or_default().to_owned())
            }
            None => HookAction::Continue,
        }
    }
}

fn with(callback: impl Callback + 'static) -> Callbacks {
    [Arc::new(callback) as Arc<dyn Callback>]
        .into_iter()
        .collect()
}

#[tokio::test]
async fn before_agent_can_answer_in_the_agents_place() {
    let cached = FnAgent::new("expensive", |ctx| {
        trace(ctx, "expensive ran");
        Ok(Control::Continue)
    })
    .with_callbacks(with(Cache));
    let root =
        Graph::sequential("root", vec![Arc::new(cached), step("next")]).expect("valid graph");
    let mut state = State::default();
    state.set("cache:expensive", json!("42, from the cache"));
    let (report, events) = run(&root, state).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(traced(&report.state), ["next"]);
    assert_eq!(ends(&events, "expensive"), [EndStatus::Skipped]);
    let answer = events
        .iter()
        .find(|e| e.author == "expensive" && e.kind == EventKind::Message)
        .expect("the cached answer");
    assert_eq!(answer.content.as_deref(), Some("42, from the cache"));
    assert_eq!(
        written(&answer.delta, "cache_hits").as_ref(),
        Some(&json!(1))
    );

    // Without a cached answer the agent runs.
    let (report, _) = run(&root, State::default()).await;
    assert_eq!(traced(&report.state), ["expensive ran", "next"]);
}

/// Writes `seen_by_callback` from state the agent before wrote, adds a closing remark,
/// and escalates when told to.
struct Reviewer {
    calls: Mutex<Vec<String>>,
}

impl Callback for Reviewer {
    fn before_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        self.calls
            .lock()
            .expect("not poisoned")
            .push(format!("before {}", ctx.branch()));
        ctx.set_state("seen_by_callback", json!(ctx.get_state("trace")));
        HookAction::Continue
    }

    fn after_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        self.calls
            .lock()
            .expect("not poisoned")
            .push(format!("after {}", ctx.agent()));
        if ctx.get_state("stop") == Some(json!(true)) {
            ctx.escalate();
        }
        HookAction::Replace(format!("{} reviewed", ctx.agent()))
    }
}

#[tokio::test]
async fn callbacks_see_earlier_writes_and_their_writes_are_seen() {
    let reviewer = Arc::new(Reviewer {
        calls: Mutex::default(),
    });
    let checked = FnAgent::new("checked", |ctx| {
        let seen = ctx.get_state("seen_by_callback").unwrap_or_default();
        ctx.set_state("agent_saw", seen);
        Ok(Control::Continue)
    })
    .with_callbacks(
        [reviewer.clone() as Arc<dyn Callback>]
            .into_iter()
            .collect(),
    );
    let root =
        Graph::sequential("root", vec![step("first"), Arc::new(checked)]).expect("valid graph");
    let (report, events) = run(&root, State::default()).await;
    assert_eq!(report.state.get("agent_saw"), Some(&json!(["first"])));
    let remark = events
        .iter()
        .rfind(|e| e.author == "checked" && e.kind == EventKind::Message)
        .expect("the after-agent remark");
    assert_eq!(remark.content.as_deref(), Some("checked reviewed"));
    assert_eq!(
        *reviewer.calls.lock().expect("not poisoned"),
        ["before root/checked", "after checked"]
    );
}

#[tokio::test]
async fn an_after_agent_callback_can_escalate() {
    let reviewer = Arc::new(Reviewer {
        calls: Mutex::default(),
    });
    let checked = FnAgent::new("checked", |ctx| {
        ctx.set_state("stop", json!(true));
        Ok(Control::Continue)
    })
    .with_callbacks([reviewer as Arc<dyn Callback>].into_iter().collect());
    let root =
        Graph::sequential("root", vec![Arc::new(checked), step("never")]).expect("valid graph");
    let (report, _) = run(&root, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Escalated);
    assert_eq!(traced(&report.state), Vec::<String>::new());
}

/// Invocation-wide callbacks (plugins) run for every agent, before the agent's own.
#[tokio::test]
async fn invocation_callbacks_run_for_every_agent_first() {
    struct Log(Arc<Mutex<Vec<String>>>, &'static str);
    impl Callback for Log {
        fn before_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
            self.0
                .lock()
                .expect("not poisoned")
                .push(format!("{} {}", self.1, ctx.agent()));
            HookAction::Continue
        }
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let own =
        FnAgent::new("b", |_| Ok(Control::Continue)).with_callbacks(with(Log(log.clone(), "own")));
    let root = Graph::sequential("root", vec![step("a"), Arc::new(own)]).expect("valid graph");
    let mut invocation = Invocation::new(SharedState::new(State::default()));
    invocation.callbacks = with(Log(log.clone(), "plugin"));
    let (report, _) = run_with(&root, invocation).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(
        *log.lock().expect("not poisoned"),
        ["plugin root", "plugin a", "plugin b", "own b"]
    );
}
