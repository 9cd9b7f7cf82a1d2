//! Shared helpers: scripted agents and a run with a memory sink.

use std::num::NonZeroU32;
use std::sync::Arc;

use engine::flow::{
    Agent, Control, EndStatus, Event, FlowError, FnAgent, Invocation, InvocationContext,
    MemorySink, RunReport, run_workflow,
};
use engine::{SharedState, State, StateDelta};
use serde_json::{Value, json};

/// `n` as a loop limit.
pub(crate) fn iters(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

/// Appends `label` to the state list `trace`.
pub(crate) fn trace(ctx: &InvocationContext, label: &str) {
    let mut list = match ctx.get_state("trace") {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    };
    list.push(json!(label));
    ctx.set_state("trace", Value::Array(list));
}

/// Increments the state number `key` and returns its new value.
pub(crate) fn bump(ctx: &InvocationContext, key: &str) -> u64 {
    let n = ctx.get_state(key).and_then(|v| v.as_u64()).unwrap_or(0) + 1;
    ctx.set_state(key, json!(n));
    n
}

/// An agent that records its name in `trace` and goes on.
pub(crate) fn step(name: &str) -> Arc<dyn Agent> {
    let label = name.to_owned();
    Arc::new(FnAgent::new(name, move |ctx| {
        trace(ctx, &label);
        Ok(Control::Continue)
    }))
}

/// An agent that records its name, counts its runs under `name`, and answers `control(n)`.
pub(crate) fn counted(
    name: &str,
    control: impl Fn(u64) -> Control + Send + Sync + 'static,
) -> Arc<dyn Agent> {
    let label = name.to_owned();
    Arc::new(FnAgent::new(name, move |ctx| {
        trace(ctx, &label);
        Ok(control(bump(ctx, &label)))
    }))
}

/// An agent that fails with `message`.
pub(crate) fn failing(name: &str, message: &str) -> Arc<dyn Agent> {
    let (agent, message) = (name.to_owned(), message.to_owned());
    Arc::new(FnAgent::new(name, move |_| {
        Err(FlowError::Agent {
            agent: agent.clone(),
            message: message.clone(),
        })
    }))
}

/// Runs `root` over `state` and returns the report and every event.
pub(crate) async fn run(root: &dyn Agent, state: State) -> (RunReport, Vec<Event>) {
    run_with(root, Invocation::new(SharedState::new(state))).await
}

/// Runs `root` with `invocation` plus a memory sink.
pub(crate) async fn run_with(root: &dyn Agent, invocation: Invocation) -> (RunReport, Vec<Event>) {
    let sink = MemorySink::new();
    let report = run_workflow(root, invocation.with_sink(Arc::new(sink.clone())), None).await;
    (report, sink.events())
}

/// The value `delta` leaves under `key` when applied to an empty state (a replace's value,
/// an append's items).
pub(crate) fn written(delta: &StateDelta, key: &str) -> Option<Value> {
    let mut state = State::default();
    state.apply(delta);
    state.get(key).cloned()
}

/// The `trace` list of a final state.
pub(crate) fn traced(state: &State) -> Vec<String> {
    state
        .get("trace")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The end status of every run of agent `author`, in order.
pub(crate) fn ends(events: &[Event], author: &str) -> Vec<EndStatus> {
    events
        .iter()
        .filter(|e| e.author == author)
        .filter_map(Event::end_status)
        .collect()
}

/// A run database in memory (SQLite), as the engine uses every store.
pub(crate) fn store_in_memory() -> std::sync::Arc<dyn engine::durable::Store> {
    std::sync::Arc::new(engine::durable::SqliteStore::open_in_memory().expect("an in-memory store"))
}
