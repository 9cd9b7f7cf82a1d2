//! The Python-backed agent tools: `python` and Python functions, called the way the agent
//! loop calls them (async, on the shared runtime), against a real session.

use std::sync::Arc;
use std::time::Duration;

use bridge::CancellationToken;
use bridge::mock::MockConfig;
use engine::{SharedState, State, StateWrite, Tool, ToolContext, ToolError};
use kernel::repl::ReplSession;
use kernel::tools::{PythonFunctionTool, PythonTool, PythonToolError};
use serde_json::{Value, json};

use crate::support::{Mock, config, no_endpoints, ok, session};

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    kernel::runtime::shared().block_on(future)
}

fn ctx() -> ToolContext {
    ToolContext::new("call_0", SharedState::new(State::default()))
}

fn call(tool: &dyn Tool, args: Value) -> Result<Value, ToolError> {
    run(tool.call(args, &ctx()))
}

fn short_session(timeout: Duration) -> Arc<ReplSession> {
    Arc::new(ReplSession::new(config(timeout), no_endpoints(), &[]).expect("session starts"))
}

fn failure(result: Result<Value, ToolError>) -> String {
    match result {
        Err(ToolError::Failed(text)) => text,
        other => panic!("expected a failed call, got {other:?}"),
    }
}

// ---- python ---------------------------------------------------------------------------------

#[test]
fn python_runs_code_and_keeps_state_between_calls() {
    let with_data = PythonTool::new(Arc::new(crate::support::session_with(&[
        kernel::repl::ContextSource::Text("abc".into()),
    ])));
    assert!(
        with_data
            .description()
            .ends_with("Loaded data is in the variables `context` (the first) and `context_0`."),
        "{}",
        with_data.description()
    );
    let tool = PythonTool::new(Arc::new(session()));
    assert!(!tool.description().contains("Loaded data"));
    assert_eq!(tool.name(), "python");
    assert_eq!(tool.parameters()["required"], json!(["code"]));
    let out = call(&tool, json!({"code": "x = 21\nprint(x * 2)"})).expect("runs");
    assert_eq!(out, json!({"stdout": "42\n", "stderr": ""}));
    let out = call(
        &tool,
        json!({"code": "import sys\nprint('warn', file=sys.stderr)\nx + 1"}),
    )
    .expect("runs");
    assert_eq!(out, json!({"stdout": "22\n", "stderr": "warn\n"}));
}

#[test]
fn python_exception_is_a_tool_error_and_the_session_goes_on() {
    let tool = PythonTool::new(Arc::new(session()));
    call(&tool, json!({"code": "total = 10"})).expect("runs");
    let text = failure(call(
        &tool,
        json!({"code": "print('before')\ntotal = total / 0"}),
    ));
    assert!(
        text.contains("ZeroDivisionError: division by zero"),
        "{text}"
    );
    assert!(text.contains("Traceback"), "{text}");
    assert!(text.contains("stdout:\nbefore"), "{text}");
    let out = call(&tool, json!({"code": "print(total)"})).expect("runs");
    assert_eq!(
        out["stdout"], "10\n",
        "the failed assignment left `total` alone"
    );
}

#[test]
fn python_honours_the_cell_timeout() {
    let session = short_session(Duration::from_millis(500));
    let tool = PythonTool::new(Arc::clone(&session));
    assert_eq!(
        tool.timeout(),
        Some(Duration::from_millis(500) + Duration::from_secs(5))
    );
    let err = call(&tool, json!({"code": "n = 1\nwhile True:\n    n += 1"}));
    assert_eq!(err, Err(ToolError::TimedOut(Duration::from_millis(500))));
    let out = call(&tool, json!({"code": "print(n > 1)"})).expect("session still works");
    assert_eq!(out["stdout"], "True\n");
}

#[test]
fn python_stops_when_the_call_is_cancelled_or_dropped() {
    let session = short_session(Duration::from_secs(60));
    let tool = PythonTool::new(Arc::clone(&session));
    // Cancelled through the call's token.
    let cancel = CancellationToken::new();
    let context = ToolContext::with_cancel("c", SharedState::new(State::default()), cancel.clone());
    let slow = json!({"code": "import time\nfor _ in range(600):\n    time.sleep(0.1)\nflag = 1"});
    let result = run(async {
        let canceller = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel();
        };
        tokio::join!(tool.call(slow.clone(), &context), canceller).0
    });
    assert_eq!(result, Err(ToolError::Cancelled));
    // Dropped by a caller's timeout: the block is stopped too, so `flag` is never set.
    let context = ctx();
    let dropped = run(async {
        tokio::time::timeout(Duration::from_millis(300), tool.call(slow, &context)).await
    });
    assert!(dropped.is_err(), "the caller's timeout fired");
    let out = call(&tool, json!({"code": "print('flag' in globals())"})).expect("runs");
    assert_eq!(out["stdout"], "False\n");
}

#[test]
fn python_reaches_sub_models_and_rejects_bad_arguments() {
    let mock = Mock::start(MockConfig::default(), bridge::Budget::default());
    let session = ReplSession::new(
        config(Duration::from_secs(30)),
        Arc::clone(&mock.endpoints),
        &[],
    )
    .expect("session starts");
    let tool = PythonTool::new(Arc::new(session));
    let out = call(&tool, json!({"code": "print(llm_query('ping'))"})).expect("runs");
    assert_eq!(out["stdout"], "ping\n");
    assert!(matches!(
        call(&tool, json!({"code": 5})),
        Err(ToolError::InvalidArguments(_))
    ));
    assert_eq!(mock.server.log().len(), 1);
}

// ---- Python functions -------------------------------------------------------------------------

const FUNCTIONS: &str = r#"
import enum
from typing import Annotated, Literal, Optional

class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"

def search(query: str, limit: int = 10, tags: Optional[list[str]] = None,
           mode: Literal["fast", "exact"] = "fast", weights: dict[str, float] | None = None):
    """Search the notes.

    Matches titles first.

    Args:
        query (str): What to look for;
            may be long.
        limit: How many results.

    Returns:
        The matches.
    """
    return {"query": query, "limit": limit, "tags": tags, "mode": mode}

def scale(value: float, factor: Annotated[float, "Multiplier"] = 2.0, flag: bool = False):
    """Scale a number.

    Parameters
    ----------
    value : float
        The number.
    """
    return value * factor

def paint(colour: Colour, anything=None):
    return (colour.value, anything)

def fail(message: str):
    raise ValueError(message)

def odd():
    return {"when": object, 1: {3, 4}, "nan": float("nan")}
"#;

fn function_tools(names: &[&str]) -> (Arc<ReplSession>, Vec<Arc<dyn Tool>>) {
    let session = Arc::new(session());
    ok(&session, FUNCTIONS);
    let tools = run(PythonFunctionTool::from_session(&session, names)).expect("tools");
    (session, tools)
}

#[test]
fn schemas_come_from_signatures_and_docstrings() {
    let (_session, tools) = function_tools(&["search", "scale", "paint"]);
    let [search, scale, paint] = &tools[..] else {
        panic!("three tools")
    };
    assert_eq!(search.name(), "search");
    assert_eq!(
        search.description(),
        "Search the notes.\n\nMatches titles first."
    );
    assert_eq!(
        search.parameters(),
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for; may be long."},
                "limit": {"type": "integer", "description": "How many results.", "default": 10},
                "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}},
                                   {"type": "null"}], "default": null},
                "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
                "weights": {"anyOf": [{"type": "object",
                                       "additionalProperties": {"type": "number"}},
                                      {"type": "null"}], "default": null},
            },
            "required": ["query"],
        })
    );
    assert_eq!(scale.description(), "Scale a number.");
    assert_eq!(
        scale.parameters(),
        json!({
            "type": "object",
            "properties": {
                "value": {"type": "number", "description": "The number."},
                "factor": {"type": "number", "description": "Multiplier", "default": 2.0},
                "flag": {"type": "boolean", "default": false},
            },
            "required": ["value"],
        })
    );
    assert_eq!(paint.description(), "Calls the Python function `paint`.");
    assert_eq!(
        paint.parameters(),
        json!({
            "type": "object",
            "properties": {
                "colour": {"type": "string", "enum": ["red", "blue"]},
                "anything": {"default": null},
            },
            "required": ["colour"],
        })
    );
}

#[test]
fn functions_are_called_with_keyword_arguments_and_return_json() {
    let (_session, tools) = function_tools(&["search", "scale", "paint", "odd"]);
    assert_eq!(
        call(&*tools[0], json!({"query": "rust", "tags": ["a"]})),
        Ok(json!({"query": "rust", "limit": 10, "tags": ["a"], "mode": "fast"}))
    );
    assert_eq!(call(&*tools[1], json!({"value": 1.5})), Ok(json!(3.0)));
    assert_eq!(
        call(&*tools[2], json!({"colour": "blue"})),
        Ok(json!(["blue", null])),
        "enum arguments arrive as members"
    );
    assert_eq!(
        call(&*tools[3], json!({})),
        Ok(json!({"when": "<class 'object'>", "1": [3, 4], "nan": "nan"})),
        "what has no JSON form becomes its repr"
    );
}

#[test]
fn function_errors_are_tool_errors_and_leave_the_session_alone() {
    let (session, tools) = function_tools(&["search", "fail"]);
    let before = session.variables().expect("variables");
    let err = call(&*tools[0], json!({"limit": 3}));
    assert!(
        matches!(&err, Err(ToolError::InvalidArguments(m)) if m.contains("query")),
        "{err:?}"
    );
    let err = call(&*tools[0], json!({"query": "x", "nope": 1}));
    assert!(
        matches!(err, Err(ToolError::InvalidArguments(_))),
        "{err:?}"
    );
    let text = failure(call(&*tools[1], json!({"message": "no such note"})));
    assert!(text.contains("ValueError: no such note"), "{text}");
    assert!(
        text.contains("in fail"),
        "the traceback shows the function: {text}"
    );
    assert!(
        !text.contains("_rlm_agent_tools"),
        "support frames are hidden: {text}"
    );
    assert_eq!(session.variables().expect("variables"), before);
    assert_eq!(
        call(&*tools[0], json!({"query": "again"}))
            .expect("still works")
            .get("query"),
        Some(&json!("again"))
    );
}

#[test]
fn a_tool_context_parameter_gets_the_state_and_the_actions() {
    let session = Arc::new(session());
    ok(
        &session,
        // Annotated as in ADK code, with a name this session does not define.
        "def note(text: str, tool_context: 'ToolContext') -> list:\n    \"\"\"Note it.\"\"\"\n    \
         tool_context.state['notes'] = tool_context.state.get('notes', []) + [text]\n    \
         tool_context.actions.skip_summarization = True\n    \
         return [len(tool_context.state['notes']), tool_context.function_call_id]\n\n\
         def forget(tool_context):\n    del tool_context.state['notes']\n    \
         tool_context.state['gone'] = None\n\n\
         def halt(tool_context):\n    tool_context.actions.exit_loop = True\n    \
         tool_context.actions.escalate = True\n\n\
         def fail(tool_context):\n    tool_context.state['x'] = 1\n    raise ValueError('no')\n",
    );
    let tools = run(PythonFunctionTool::from_session(
        &session,
        &["note", "forget", "halt", "fail"],
    ))
    .expect("tools");
    assert_eq!(
        tools[0].parameters(),
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        "`tool_context` is not in the schema"
    );
    let mut state = State::default();
    state.set("notes", json!(["a"]));
    let context = ToolContext::new("call_7", SharedState::new(state));
    assert_eq!(
        run(tools[0].call(json!({"text": "b"}), &context)),
        Ok(json!([2, "call_7"]))
    );
    let (delta, actions) = context.take_effects();
    // The list only grew at its end: the write is an append of the new item.
    assert_eq!(
        delta.iter().cloned().collect::<Vec<_>>(),
        [StateWrite::Append {
            key: "notes".into(),
            items: vec![json!("b")]
        }]
    );
    assert!(
        actions.end_turn && !actions.exit_loop && !actions.escalate,
        "ADK's `skip_summarization` is `end_turn`: {actions:?}"
    );
    let err = call(&*tools[0], json!({"text": "c", "tool_context": {}}));
    assert!(
        matches!(&err, Err(ToolError::InvalidArguments(m)) if m.contains("`tool_context` is given by the kernel")),
        "{err:?}"
    );
    // A delete is a write of its own, not a `null`.
    assert_eq!(run(tools[1].call(json!({}), &context)), Ok(json!(null)));
    assert_eq!(
        context.take_effects().0.iter().cloned().collect::<Vec<_>>(),
        [
            StateWrite::Delete {
                key: "notes".into()
            },
            StateWrite::Replace {
                key: "gone".into(),
                value: json!(null)
            }
        ]
    );
    assert_eq!(context.get_state("notes"), None);
    assert_eq!(context.get_state("gone"), Some(json!(null)));
    let text = failure(run(tools[3].call(json!({}), &context)));
    assert!(text.contains("ValueError: no"), "{text}");
    assert!(
        context.take_effects().0.is_empty(),
        "a failed call writes nothing"
    );
    assert_eq!(run(tools[2].call(json!({}), &context)), Ok(json!(null)));
    let actions = context.take_actions();
    assert!(
        actions.exit_loop && actions.escalate && !actions.end_turn,
        "{actions:?}"
    );
}

#[test]
fn function_calls_honour_the_cell_timeout() {
    let session = short_session(Duration::from_millis(500));
    ok(
        &session,
        "import time\ndef wait(seconds: float):\n    time.sleep(seconds)\n    return seconds",
    );
    let tools = run(PythonFunctionTool::from_session(&session, &["wait"])).expect("tools");
    assert_eq!(call(&*tools[0], json!({"seconds": 0.01})), Ok(json!(0.01)));
    assert_eq!(
        call(&*tools[0], json!({"seconds": 30})),
        Err(ToolError::TimedOut(Duration::from_millis(500)))
    );
}

#[test]
fn a_tools_file_runs_in_the_session_and_offers_its_public_functions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tools.py");
    std::fs::write(
        &path,
        "GREETING = 'hello'\n\ndef _private():\n    pass\n\n\
         def greet(name: str) -> str:\n    \"\"\"Greet someone.\"\"\"\n    return f'{GREETING}, {name}'\n\n\
         def shout(text: str):\n    return text.upper()\n",
    )
    .expect("write");
    let session = Arc::new(session());
    let tools = run(PythonFunctionTool::from_file(&session, &path)).expect("tools");
    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["greet", "shout"]);
    assert_eq!(tools[0].description(), "Greet someone.");
    assert_eq!(
        call(&*tools[0], json!({"name": "Ada"})),
        Ok(json!("hello, Ada"))
    );
    // The file ran in the session, like `%run`.
    let out = ok(&session, "print(GREETING)");
    assert_eq!(out.stdout, "hello\n");
    // `__all__` decides when the file has one.
    let listed = dir.path().join("listed.py");
    std::fs::write(&listed, "__all__ = ['b']\ndef a(): pass\ndef b(): pass\n").expect("write");
    let tools = run(PythonFunctionTool::from_file(&session, &listed)).expect("tools");
    assert_eq!(tools.iter().map(|t| t.name()).collect::<Vec<_>>(), ["b"]);
}

#[test]
fn functions_that_cannot_be_tools_are_clear_errors() {
    let session = Arc::new(session());
    ok(
        &session,
        "number = 3\ndef only_positional(a, /, b):\n    pass\ndef café():\n    pass",
    );
    let error = |names: &[&str]| {
        run(PythonFunctionTool::from_session(&session, names))
            .err()
            .expect("refused")
            .to_string()
    };
    assert_eq!(
        error(&["missing"]),
        "No function `missing` is defined in the session"
    );
    assert_eq!(
        error(&["number"]),
        "`number` in the session is a `int`, not a function"
    );
    assert!(error(&["only_positional"]).contains("positional-only"));
    assert!(error(&["café"]).contains("tool names must match"));

    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("absent.py");
    let err = run(PythonFunctionTool::from_file(&session, &missing))
        .err()
        .expect("refused");
    assert!(
        matches!(&err, PythonToolError::File { message, .. } if message.contains("FileNotFoundError")),
        "{err}"
    );
    let broken = dir.path().join("broken.py");
    std::fs::write(&broken, "def f(:\n    pass\n").expect("write");
    let err = run(PythonFunctionTool::from_file(&session, &broken))
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("SyntaxError") && text.contains("broken.py"),
        "{text}"
    );
}

// ---- in the agent loop ------------------------------------------------------------------------

/// The agent loop over the mock: the model calls `python` and a session function in one
/// reply, and answers from the last tool result.
#[test]
fn the_agent_loop_runs_python_tools_over_both_wire_formats() {
    use bridge::mock::{MockServer, Script};
    use bridge::{Budget, Endpoint, EndpointConfig, Ledger, Message, Role};
    use engine::agent::{AgentLoop, LoopConfig, Toolbox};

    let script = Script::from_json_value(json!({"models": {"*": {
        "rules": [{"tool_name": "^greet$", "last_tool": "hello, (\\w+)",
                   "reply": "Greeted {{1}}."}],
        "replies": [{"tool_calls": [
            {"name": "python", "arguments": {"code": "total = 6 * 7\nprint(total)"}},
            {"name": "greet", "arguments": {"name": "Ada"}},
        ]}],
    }}}))
    .expect("valid script");
    let session = Arc::new(session());
    ok(
        &session,
        "def greet(name: str) -> str:\n    \"\"\"Greet someone.\"\"\"\n    return f'hello, {name}'",
    );
    let mut tools = run(PythonFunctionTool::from_session(&session, &["greet"])).expect("tools");
    tools.insert(0, Arc::new(PythonTool::new(Arc::clone(&session))));
    let toolbox = || {
        tools
            .iter()
            .try_fold(Toolbox::new(), |t, tool| t.with(Arc::clone(tool)))
            .expect("toolbox")
    };
    run(async {
        let server = MockServer::start(bridge::mock::MockConfig {
            script,
            ..bridge::mock::MockConfig::default()
        })
        .await
        .expect("mock starts");
        for (anthropic, stream) in [(false, true), (true, false)] {
            let config = if anthropic {
                EndpointConfig::anthropic("root", server.anthropic_base_url(), "m")
            } else {
                EndpointConfig::openai("root", server.openai_base_url(), "m")
            };
            let endpoint =
                Endpoint::new(config, Arc::new(Ledger::new(Budget::default()))).expect("endpoint");
            let agent = AgentLoop::new(
                Arc::new(endpoint),
                toolbox(),
                LoopConfig {
                    stream,
                    ..LoopConfig::default()
                },
            );
            let outcome = agent
                .run(
                    vec![Message::user("Compute and greet")],
                    SharedState::default(),
                    CancellationToken::new(),
                )
                .await
                .expect("answer");
            assert_eq!(outcome.answer, "Greeted Ada.");
            let results: Vec<&str> = outcome
                .run
                .transcript
                .iter()
                .filter(|m| m.role == Role::Tool)
                .map(|m| m.content.as_str())
                .collect();
            assert_eq!(results.len(), 2, "{results:?}");
            let python: Value = serde_json::from_str(results[0]).expect("JSON result");
            assert_eq!(python["stdout"], "42\n");
            assert_eq!(results[1], "hello, Ada");
        }
    });
    let out = ok(&session, "print(total)");
    assert_eq!(
        out.stdout, "42\n",
        "the model's code ran in the agent's session"
    );
}
