//! Plan and discover: a planner agent asks, a discovery loop answers, through namespaced
//! `temp:discovery:*` keys (the `plan-discover` workflow; any workflow may use them).
//!
//! - `request_discovery(query, context)` ([`RequestDiscovery`]) writes the query and what the
//!   planner knows, clears the last round's findings and note, counts the round, sets the
//!   phase to `requested` and **ends the planner's turn**, so the enclosing loop moves on to
//!   the discovery agent.
//! - The discovery agent is skipped unless a discovery is requested
//!   ([`SKIP_UNLESS_REQUESTED`], a before-agent callback for it).
//! - `write_discovery_results_and_exit(results, summary)` ([`WriteDiscoveryResults`]) writes
//!   the results, sets the ready flag and the phase `done`, and ends the **nearest** loop —
//!   the discovery loop — so the outer loop goes on to the planner, which reads the results
//!   from its instruction (`{temp:discovery:results?}`).
//! - `write_planning_artifact(name, content)` ([`WritePlanningArtifact`]) writes a document
//!   into the output folder the state names (`output_dir` by default, else
//!   `planning-artifacts`; a relative folder is resolved once, against the working
//!   directory); a name that leads outside that folder is refused.
//!
//! - [`REQUIRE_ARTIFACT`]: a run must not end as done without its plan (the tool failed,
//!   or was never called). As a before-tool callback of the planner it refuses `exit_loop`
//!   while no artifact is written, telling the model to write the plan first; as an
//!   after-agent callback of the workflow's root it fails the run that ended without one (the
//!   loop ran out of rounds, or the planner never wrote), saying so.
//!
//! [`with_discovery`] registers the tools and both callbacks with a [`Registry`].

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::build::Registry;
use super::callbacks::{Callback, CallbackContext, ToolInvocation};
use crate::bundle::Sandbox;
use crate::hook::HookAction;
use crate::tool::{Tool, ToolContext, ToolError};

/// The query the planner asked (`temp:discovery:query`).
pub(crate) const QUERY: &str = "temp:discovery:query";
/// What the planner already knows, for the discovery (`temp:discovery:context`).
pub(crate) const CONTEXT: &str = "temp:discovery:context";
/// The discovery's results (`temp:discovery:results`).
pub(crate) const RESULTS: &str = "temp:discovery:results";
/// A one-line summary of the results (`temp:discovery:summary`).
pub(crate) const SUMMARY: &str = "temp:discovery:summary";
/// Whether results for the latest query are there (`temp:discovery:ready`).
pub(crate) const READY: &str = "temp:discovery:ready";
/// What the discovery found for the current query (`temp:discovery:findings`).
pub(crate) const FINDINGS: &str = "temp:discovery:findings";
/// What a check of the findings said is missing (`temp:discovery:note`).
pub(crate) const NOTE: &str = "temp:discovery:note";
/// `requested` while a query waits, `done` once answered (`temp:discovery:phase`).
pub(crate) const PHASE: &str = "temp:discovery:phase";
/// How many discoveries were requested so far (`temp:discovery:round`).
pub(crate) const ROUND: &str = "temp:discovery:round";
/// The phase while a query waits for discovery.
pub(crate) const REQUESTED: &str = "requested";
/// The phase once the discovery wrote its results.
pub(crate) const DONE: &str = "done";
/// The session key listing the artifacts written (`planning_artifacts`).
pub(crate) const ARTIFACTS: &str = "planning_artifacts";
/// The callback that skips the discovery agent unless a discovery is requested.
pub(crate) const SKIP_UNLESS_REQUESTED: &str = "skip_unless_discovery_requested";
/// The callback that refuses `exit_loop` until an artifact is written.
pub(crate) const REQUIRE_ARTIFACT: &str = "require_planning_artifact";
/// The state key naming the artifacts' folder, unless the tool's `args` say otherwise.
pub(crate) const DEFAULT_FOLDER_KEY: &str = "output_dir";
/// The artifacts' folder when the state names none (relative to the working directory).
pub(crate) const DEFAULT_FOLDER: &str = "planning-artifacts";

/// `registry` with `request_discovery`, `write_discovery_results_and_exit`,
/// `write_planning_artifact` and the callback `SKIP_UNLESS_REQUESTED`.
pub fn with_discovery(registry: Registry) -> Registry {
    registry
        .with_tool(Arc::new(RequestDiscovery))
        .with_tool(Arc::new(WriteDiscoveryResults))
        .with_tool_factory("write_planning_artifact", |args| {
            let args: ArtifactArgs = serde_json::from_value(args.clone())
                .map_err(|e| format!("{e}; `args` may set `folder_key` and `default_folder`"))?;
            Ok(Arc::new(WritePlanningArtifact {
                folder_key: args
                    .folder_key
                    .unwrap_or_else(|| DEFAULT_FOLDER_KEY.to_owned()),
                default_folder: args
                    .default_folder
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_FOLDER)),
            }))
        })
        .with_callback(SKIP_UNLESS_REQUESTED, Arc::new(SkipUnlessRequested))
        .with_callback(REQUIRE_ARTIFACT, Arc::new(RequireArtifact))
}

fn string_arg<'a>(args: &'a Value, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidArguments(format!("`{name}` must be a string")))
}

/// `request_discovery`; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestDiscovery;

#[async_trait]
impl Tool for RequestDiscovery {
    fn name(&self) -> &str {
        "request_discovery"
    }

    fn description(&self) -> &str {
        "Ask the discovery agent to find facts in the user's data. Your turn ends with this \
         call; the results are in your instructions at your next turn."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The question to answer from the data."},
                "context": {"type": "string", "description": "What you know already and why you ask."}
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let query = string_arg(&args, "query")?;
        if query.trim().is_empty() {
            return Err(ToolError::InvalidArguments(
                "`query` is empty; say what to find out".to_owned(),
            ));
        }
        let context = match args.get("context") {
            None | Some(Value::Null) => "",
            Some(_) => string_arg(&args, "context")?,
        };
        let round = ctx.get_state(ROUND).and_then(|v| v.as_u64()).unwrap_or(0) + 1;
        ctx.set_state(QUERY, json!(query));
        ctx.set_state(CONTEXT, json!(context));
        // The last round's work must not pass for an answer to this query.
        ctx.set_state(FINDINGS, json!(""));
        ctx.set_state(NOTE, json!(""));
        ctx.set_state(READY, json!(false));
        ctx.set_state(PHASE, json!(REQUESTED));
        ctx.set_state(ROUND, json!(round));
        ctx.end_turn();
        Ok(json!({"success": true, "round": round,
                  "status": "Discovery requested; the results come at your next turn."}))
    }
}

/// `write_discovery_results_and_exit`; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WriteDiscoveryResults;

#[async_trait]
impl Tool for WriteDiscoveryResults {
    fn name(&self) -> &str {
        "write_discovery_results_and_exit"
    }

    fn description(&self) -> &str {
        "Hand the discovery's results to the planner and end the discovery."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "results": {"type": "string", "description": "The facts found, with their numbers."},
                "summary": {"type": "string", "description": "One line: what was found."}
            },
            "required": ["results", "summary"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let results = string_arg(&args, "results")?;
        let summary = string_arg(&args, "summary")?;
        ctx.set_state(RESULTS, json!(results));
        ctx.set_state(SUMMARY, json!(summary));
        ctx.set_state(READY, json!(true));
        ctx.set_state(PHASE, json!(DONE));
        ctx.exit_loop();
        Ok(json!({"success": true}))
    }
}

/// What `args` of `write_planning_artifact` may set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArtifactArgs {
    folder_key: Option<String>,
    default_folder: Option<PathBuf>,
}

/// `write_planning_artifact`; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct WritePlanningArtifact {
    folder_key: String,
    default_folder: PathBuf,
}

impl WritePlanningArtifact {
    /// Writes into the folder state key `folder_key` names, else `default_folder`.
    #[cfg(test)]
    pub(crate) fn new(folder_key: impl Into<String>, default_folder: impl Into<PathBuf>) -> Self {
        Self {
            folder_key: folder_key.into(),
            default_folder: default_folder.into(),
        }
    }

    /// The output folder, absolute: a relative one is taken from the working directory
    /// (once: the sandbox resolves names against it, so it must not be relative again).
    fn folder(&self, ctx: &ToolContext) -> Result<PathBuf, ToolError> {
        let folder = match ctx.get_state(&self.folder_key) {
            None | Some(Value::Null) => self.default_folder.clone(),
            Some(Value::String(folder)) if !folder.trim().is_empty() => PathBuf::from(folder),
            Some(other) => {
                return Err(ToolError::Failed(format!(
                    "State key `{}` must name the output folder as a string, not `{other}`",
                    self.folder_key
                )));
            }
        };
        std::path::absolute(&folder).map_err(|e| {
            ToolError::Failed(format!(
                "The output folder `{}` cannot be resolved against the working directory: {e}",
                folder.display()
            ))
        })
    }
}

#[async_trait]
impl Tool for WritePlanningArtifact {
    fn name(&self) -> &str {
        "write_planning_artifact"
    }

    fn description(&self) -> &str {
        "Write a planning document (e.g. `plan.md`) into the output folder, replacing a document \
         of that name. `name` is relative to the output folder."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The document's file name, e.g. `plan.md`."},
                "content": {"type": "string", "description": "Its whole text."}
            },
            "required": ["name", "content"],
            "additionalProperties": false
        })
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let name = string_arg(&args, "name")?;
        let content = string_arg(&args, "content")?;
        let folder = self.folder(ctx)?;
        std::fs::create_dir_all(&folder).map_err(|e| {
            ToolError::Failed(format!(
                "Could not create the output folder `{}`: {e}",
                folder.display()
            ))
        })?;
        let failed = |e: crate::bundle::PathError| ToolError::Failed(e.to_string());
        let sandbox =
            Sandbox::new(std::slice::from_ref(&folder), &folder, &folder).map_err(failed)?;
        let path = sandbox
            .write_text(name, content, self.name())
            .map_err(failed)?;
        let shown = path.display().to_string();
        let mut written: Vec<Value> = ctx
            .get_state(ARTIFACTS)
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        if !written.contains(&json!(shown)) {
            written.push(json!(shown));
        }
        ctx.set_state(ARTIFACTS, Value::Array(written));
        Ok(json!({"success": true, "path": shown, "bytes": content.len()}))
    }
}

/// Skips the agent it is named for unless the phase is `requested`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SkipUnlessRequested;

impl Callback for SkipUnlessRequested {
    fn before_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        if ctx.get_state(PHASE) == Some(json!(REQUESTED)) {
            HookAction::Continue
        } else {
            HookAction::Replace("No discovery was requested; skipped.".to_owned())
        }
    }
}

/// [`REQUIRE_ARTIFACT`]; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequireArtifact;

impl RequireArtifact {
    /// Whether an artifact is written.
    fn written(ctx: &CallbackContext) -> bool {
        ctx.get_state(ARTIFACTS)
            .and_then(|v| v.as_array().map(|a| !a.is_empty()))
            .unwrap_or(false)
    }
}

impl Callback for RequireArtifact {
    fn before_tool(&self, ctx: &CallbackContext, call: &mut ToolInvocation) -> HookAction<Value> {
        if call.name != "exit_loop" || Self::written(ctx) {
            return HookAction::Continue;
        }
        HookAction::Replace(json!({
            "error": "Not finished: no plan is written yet. Write it with \
                      `write_planning_artifact` (if it failed, its error says why), then call \
                      `exit_loop`."
        }))
    }

    fn after_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        if Self::written(ctx) {
            return HookAction::Continue;
        }
        HookAction::Stop(
            "the run ended without its plan: `write_planning_artifact` never wrote one (it \
             was not called, or it failed: its error is in the run's events)"
                .to_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{SharedState, State};

    fn ctx() -> (ToolContext, SharedState) {
        let state = SharedState::new(State::default());
        (ToolContext::new("call_0", state.clone()), state)
    }

    #[test]
    fn exit_loop_is_refused_until_an_artifact_is_written() {
        let state = SharedState::new(State::default());
        let cb = CallbackContext::new("planner", "plan_discover/planner", state.clone());
        let call = |name: &str| ToolInvocation {
            call_id: "call_1".into(),
            name: name.into(),
            args: json!({}),
        };
        let refused = RequireArtifact.before_tool(&cb, &mut call("exit_loop"));
        assert!(
            matches!(&refused, HookAction::Replace(v) if v["error"].as_str().is_some_and(|e| e.contains("write_planning_artifact"))),
            "{refused:?}"
        );
        assert_eq!(
            RequireArtifact.before_tool(&cb, &mut call("request_discovery")),
            HookAction::Continue
        );
        state.set(ARTIFACTS, json!([]));
        assert_ne!(
            RequireArtifact.before_tool(&cb, &mut call("exit_loop")),
            HookAction::Continue
        );
        state.set(ARTIFACTS, json!(["/out/plan.md"]));
        assert_eq!(
            RequireArtifact.before_tool(&cb, &mut call("exit_loop")),
            HookAction::Continue
        );
    }

    #[test]
    fn a_run_that_ends_without_an_artifact_is_stopped() {
        let state = SharedState::new(State::default());
        let cb = CallbackContext::new("plan_discover", "plan_discover", state.clone());
        let stopped = RequireArtifact.after_agent(&cb);
        assert!(
            matches!(&stopped, HookAction::Stop(why) if why.contains("without its plan")),
            "{stopped:?}"
        );
        state.set(ARTIFACTS, json!(["/out/plan.md"]));
        assert_eq!(RequireArtifact.after_agent(&cb), HookAction::Continue);
    }

    #[tokio::test]
    async fn a_request_writes_the_namespaced_keys_and_ends_the_turn() {
        let (ctx, state) = ctx();
        state.set(FINDINGS, json!("last round's answer"));
        let out = RequestDiscovery
            .call(json!({"query": "Which region?", "context": "Q3"}), &ctx)
            .await
            .expect("requested");
        assert_eq!(out["round"], json!(1));
        assert_eq!(state.get(QUERY), Some(json!("Which region?")));
        assert_eq!(state.get(CONTEXT), Some(json!("Q3")));
        assert_eq!(state.get(PHASE), Some(json!(REQUESTED)));
        assert_eq!(state.get(READY), Some(json!(false)));
        assert_eq!(
            state.get(FINDINGS),
            Some(json!("")),
            "cleared for the new query"
        );
        let (_, actions) = ctx.take_effects();
        assert!(actions.end_turn && !actions.exit_loop && !actions.escalate);
        let again = RequestDiscovery
            .call(json!({"query": "And the south?"}), &ctx)
            .await
            .expect("requested");
        assert_eq!(again["round"], json!(2));
        let empty = RequestDiscovery.call(json!({"query": " "}), &ctx).await;
        assert!(matches!(empty, Err(ToolError::InvalidArguments(_))));
    }

    #[tokio::test]
    async fn results_set_the_ready_flag_and_exit_only_the_loop() {
        let (ctx, state) = ctx();
        WriteDiscoveryResults
            .call(
                json!({"results": "North +4%", "summary": "North grew"}),
                &ctx,
            )
            .await
            .expect("written");
        assert_eq!(state.get(RESULTS), Some(json!("North +4%")));
        assert_eq!(state.get(SUMMARY), Some(json!("North grew")));
        assert_eq!(state.get(READY), Some(json!(true)));
        assert_eq!(state.get(PHASE), Some(json!(DONE)));
        let (_, actions) = ctx.take_effects();
        assert!(actions.exit_loop && !actions.end_turn && !actions.escalate);
    }

    #[tokio::test]
    async fn artifacts_go_into_the_named_folder_and_hostile_names_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        let (ctx, state) = ctx();
        state.set("output_dir", json!(out.display().to_string()));
        let tool = WritePlanningArtifact::new(DEFAULT_FOLDER_KEY, DEFAULT_FOLDER);
        let written = tool
            .call(json!({"name": "plan.md", "content": "# Plan"}), &ctx)
            .await
            .expect("written");
        assert_eq!(
            std::fs::read_to_string(out.join("plan.md")).expect("the artifact"),
            "# Plan"
        );
        assert_eq!(
            state.get(ARTIFACTS),
            Some(json!([written["path"].as_str().expect("a path")]))
        );
        for hostile in ["../escape.md", "/etc/passwd", "sub/../../escape.md", "a\0b"] {
            let refused = tool
                .call(json!({"name": hostile, "content": "x"}), &ctx)
                .await;
            assert!(matches!(refused, Err(ToolError::Failed(_))), "{hostile}");
        }
        assert!(!dir.path().join("escape.md").exists());
        let fallback = WritePlanningArtifact::new("plan_dir", dir.path().join("default"));
        fallback
            .call(json!({"name": "notes/risks.md", "content": "- none"}), &ctx)
            .await
            .expect("written where the state names no folder");
        assert!(dir.path().join("default/notes/risks.md").is_file());
        state.set("output_dir", json!(7));
        let bad = tool
            .call(json!({"name": "plan.md", "content": "x"}), &ctx)
            .await;
        assert!(
            matches!(&bad, Err(ToolError::Failed(m)) if m.contains("`output_dir`")),
            "{bad:?}"
        );
    }

    #[test]
    fn the_discovery_is_skipped_unless_requested() {
        let state = SharedState::new(State::default());
        let cb = CallbackContext::new("discovery", "plan/discovery", state.clone());
        assert!(matches!(
            SkipUnlessRequested.before_agent(&cb),
            HookAction::Replace(_)
        ));
        state.set(PHASE, json!(REQUESTED));
        assert!(matches!(
            SkipUnlessRequested.before_agent(&cb),
            HookAction::Continue
        ));
        state.set(PHASE, json!(DONE));
        assert!(matches!(
            SkipUnlessRequested.before_agent(&cb),
            HookAction::Replace(_)
        ));
    }
}
