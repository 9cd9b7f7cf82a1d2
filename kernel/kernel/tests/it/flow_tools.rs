//! Workflow tools in Google ADK's convention, through the real REPL and the mock LM server:
//! `tools.py:lookup` is called with keyword arguments, described by its signature and
//! docstring (the same builder as `rlm agent --python`), and reaches the workflow's state
//! and actions through a `tool_context` parameter.

use engine::State;
use engine::flow::Control;
use serde_json::{Value, json};

use crate::flow::{Setup, setup, tool_results};

const TOOLS: &str = r#"from typing import Literal, Optional

def lookup(region: str, year: int = 2024, tags: Optional[list[str]] = None,
           unit: Literal["usd", "eur"] = "usd", tool_context=None) -> dict:
    """Sales of one region.

    Args:
        region: The region's name.
        year: The year to report.
        tags: Labels to filter by.
        unit: The currency.
    """
    seen = tool_context.state.get("seen", [])
    tool_context.state["seen"] = seen + [region]
    return {"region": region, "year": year, "sales": len(seen) + 1, "unit": unit}

def check(tool_context):
    """What the earlier lookups wrote."""
    tool_context.state["checked"] = list(tool_context.state["seen"])
    tool_context.state["seen"].append("checked")
    return {"seen": tool_context.state["seen"][:-1]}

def broken(note: str):
    """Always fails."""
    raise ValueError("no data for " + note)

def transfer(tool_context):
    """Tries an ADK action this kernel does not have."""
    tool_context.actions.transfer_to_agent = "other"
"#;

/// The request bodies the mock received, in order.
fn bodies(s: &Setup) -> Vec<Value> {
    s.server
        .log()
        .entries()
        .iter()
        .filter_map(|r| r.body.as_deref())
        .map(|b| serde_json::from_str(b).expect("a JSON body"))
        .collect()
}

/// The content of each tool message of the last request, in order.
fn tool_messages(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn workflow_tools_take_keyword_arguments_and_reach_the_state_through_tool_context() {
    let script = json!({"models": {"root": {"replies": [
        {"tool_calls": [{"name": "lookup", "arguments": {"region": "north", "unit": "eur"}}]},
        {"tool_calls": [{"name": "check", "arguments": {}}]},
        {"tool_calls": [
            {"name": "lookup", "arguments": {"year": 2023}},
            {"name": "broken", "arguments": {"note": "the south"}},
            {"name": "transfer", "arguments": {}},
        ]},
        "Done.",
    ]}}});
    let s = setup(script, Vec::new());
    s.write("tools.py", TOOLS);
    s.write(
        "steps.py",
        "def after(state):\n    return {'after_saw': state['seen']}\n",
    );
    s.write(
        "analyst.yaml",
        "name: analyst\nmodel: root\ninstruction: Look the regions up.\n\
         tools:\n  - name: tools.py:lookup\n  - name: tools.py:check\n\
         \x20 - name: tools.py:broken\n  - name: tools.py:transfer\n",
    );
    s.write(
        "after.yaml",
        "agent_class: PythonAgent\nname: after\nfunction: steps.py:after\n",
    );
    let root = s.write(
        "root.yaml",
        "agent_class: SequentialAgent\nname: root\n\
         sub_agents: [{config_path: analyst.yaml}, {config_path: after.yaml}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let (report, events) = s.run(flow.as_ref(), State::default());
    assert_eq!(report.result, Ok(Control::Continue), "{events:#?}");

    // The schema on the wire comes from the type hints, defaults and the docstring;
    // `tool_context` is not in it.
    let bodies = bodies(&s);
    let tools = bodies[0]["tools"].as_array().expect("tools sent");
    let lookup = tools
        .iter()
        .find(|t| t["function"]["name"] == "lookup")
        .expect("lookup offered");
    assert_eq!(lookup["function"]["description"], "Sales of one region.");
    assert_eq!(
        lookup["function"]["parameters"],
        json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "description": "The region's name."},
                "year": {"type": "integer", "description": "The year to report.", "default": 2024},
                "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                         "description": "Labels to filter by.", "default": null},
                "unit": {"type": "string", "enum": ["usd", "eur"], "description": "The currency.",
                         "default": "usd"},
            },
            "required": ["region"],
        })
    );
    assert_eq!(
        tools
            .iter()
            .find(|t| t["function"]["name"] == "check")
            .map(|t| &t["function"]["parameters"]),
        Some(&json!({"type": "object", "properties": {}}))
    );

    // Keyword arguments in, JSON out; the first call's state write was there for the next
    // tool, and an in-place change (`append`) counts as a write.
    let results = tool_results(&events);
    assert_eq!(
        results[0],
        (
            "lookup".to_owned(),
            json!({"region": "north", "year": 2024, "sales": 1, "unit": "eur"})
        )
    );
    assert_eq!(results[1], ("check".to_owned(), json!({"seen": ["north"]})));
    assert_eq!(report.state.get("checked"), Some(&json!(["north"])));
    // ... and for the next agent.
    assert_eq!(
        report.state.get("after_saw"),
        Some(&json!(["north", "checked"]))
    );

    // A missing argument, an exception and an unknown action reach the model as tool
    // errors it can act on; the failed calls wrote nothing.
    let errors = tool_messages(bodies.last().expect("a last request"));
    let [missing, raised, transfer] = &errors[errors.len() - 3..] else {
        panic!("three tool results: {errors:?}")
    };
    assert!(missing.contains("\"success\":false"), "{missing}");
    assert!(missing.contains("region"), "{missing}");
    assert!(
        !missing.contains("TypeError"),
        "checked before the call: {missing}"
    );
    assert!(
        raised.contains("ValueError: no data for the south"),
        "{raised}"
    );
    assert!(
        raised.contains("in broken"),
        "the traceback starts at the function: {raised}"
    );
    assert!(
        transfer.contains("`tool_context.actions.transfer_to_agent` is not an action here"),
        "{transfer}"
    );
    assert_eq!(
        report.state.get("seen"),
        Some(&json!(["north", "checked"])),
        "the failed lookup wrote nothing"
    );
}

#[test]
fn a_tool_context_exit_loop_ends_the_nearest_loop_only() {
    // `stop` ends the worker's turn and its inner loop at once; the outer loop goes on.
    let script = json!({"models": {"root": {"replies": [
        {"tool_calls": [{"name": "stop", "arguments": {"reason": "enough"}}]},
    ]}}});
    let s = setup(script, Vec::new());
    s.write(
        "tools.py",
        "def stop(reason: str, tool_context) -> str:\n    \"\"\"Ends the inner loop.\"\"\"\n    \
         tool_context.state['stops'] = tool_context.state.get('stops', 0) + 1\n    \
         tool_context.actions.exit_loop = True\n    return reason\n",
    );
    s.write(
        "steps.py",
        "def count(state):\n    return {'rounds': state.get('rounds', 0) + 1}\n",
    );
    s.write(
        "worker.yaml",
        "name: worker\nmodel: root\ninstruction: Work.\ntools: [{name: tools.py:stop}]\n",
    );
    s.write(
        "inner.yaml",
        "agent_class: LoopAgent\nname: inner\nmax_iterations: 5\n\
         sub_agents: [{config_path: worker.yaml}]\n",
    );
    s.write(
        "count.yaml",
        "agent_class: PythonAgent\nname: count\nfunction: steps.py:count\n",
    );
    let root = s.write(
        "outer.yaml",
        "agent_class: LoopAgent\nname: outer\nmax_iterations: 2\n\
         sub_agents: [{config_path: inner.yaml}, {config_path: count.yaml}]\n",
    );
    let flow = s.build(&root).expect("builds");
    let (report, events) = s.run(flow.as_ref(), State::default());
    assert_eq!(report.result, Ok(Control::Continue), "{events:#?}");
    assert_eq!(
        report.state.get("stops"),
        Some(&json!(2)),
        "one worker turn per round"
    );
    assert_eq!(
        report.state.get("rounds"),
        Some(&json!(2)),
        "the outer loop ran on"
    );
    assert_eq!(s.server.log().len(), 2, "no model call after the exit");
}

#[test]
fn a_tool_written_the_old_ctx_way_is_refused_at_load_time() {
    let s = setup(json!({"models": {}}), Vec::new());
    s.write(
        "tools.py",
        "def lookup(ctx):\n    return ctx['args']['region']\n\n\
         def grow(region: str, year: int = 2024):\n    return region\n",
    );
    let old = s.write(
        "old.yaml",
        "name: a\nmodel: root\ntools:\n  - name: tools.py:lookup\n    args:\n      \
         parameters: {type: object, properties: {region: {type: string}}}\n",
    );
    let dir = s.dir.path().display().to_string();
    let message = |path: &std::path::Path| {
        s.build(path)
            .map(|_| ())
            .expect_err("refused")
            .to_string()
            .replace(&dir, "[DIR]")
    };
    insta::assert_snapshot!(message(&old));

    // `args.parameters` must fit the signature; `args.description` overrides the docstring.
    for (args, expected) in [
        (
            "{parameters: {type: object, properties: {region: {type: string}, month: {}}, required: [region]}}",
            "the function takes no `month` (it takes `region`, `year`)",
        ),
        (
            "{parameters: {type: object, properties: {region: {type: string}}}}",
            "the function needs `region` but `required` does not list it",
        ),
    ] {
        let path = s.write(
            "bad.yaml",
            &format!("name: a\nmodel: root\ntools:\n  - name: tools.py:grow\n    args: {args}\n"),
        );
        let text = message(&path);
        assert!(text.contains(expected), "{text}");
    }
    let missing = s.write(
        "missing.yaml",
        "name: a\nmodel: root\ntools:\n  - name: tools.py:absent\n",
    );
    let text = message(&missing);
    assert!(
        text.contains("Cannot load a tool from `[DIR]/tools.py`")
            && text.contains("AttributeError"),
        "{text}"
    );
}
