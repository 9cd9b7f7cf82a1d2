//! `rlm flow run` on a workflow whose agent calls a Python tool written the Google ADK way
//! (keyword arguments, a `tool_context` for the state and actions), over both wire formats.

use serde_json::json;

use crate::flow::{read_events, run_flow};
use crate::support::{Mock, file};

#[test]
fn flow_run_calls_an_adk_style_python_tool_and_keeps_its_state_writes() {
    for provider in ["openai", "anthropic"] {
        let dir = tempfile::tempdir().expect("tempdir");
        file(
            dir.path(),
            "tools.py",
            "def lookup(region: str, tool_context) -> dict:\n    \
             \"\"\"Sales of one region.\n\n    Args:\n        region: The region's name.\n    \"\"\"\n    \
             tool_context.state['looked_up'] = region\n    \
             tool_context.actions.exit_loop = True\n    \
             return {'region': region, 'sales': 42}\n",
        );
        file(
            dir.path(),
            "analyst.yaml",
            "name: analyst\ninstruction: Look the north up.\noutput_key: answer\n\
             tools: [{name: tools.py:lookup}]\n",
        );
        let flow = file(
            dir.path(),
            "flow.yaml",
            "agent_class: LoopAgent\nname: rounds\nmax_iterations: 3\n\
             sub_agents: [{config_path: analyst.yaml}]\n",
        );
        let mock = Mock::start(json!({"models": {"flow-model": {"replies": [
            {"tool_calls": [{"name": "lookup", "arguments": {"region": "north"}}]},
        ]}}}));
        let run = run_flow(&mock, provider, dir.path(), &[flow.display().to_string()]);
        run.assert_code(0);
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("state.json")).expect("state kept"),
        )
        .expect("JSON");
        assert_eq!(state["looked_up"], json!("north"), "{provider}");
        let events = read_events(&dir.path().join("events.jsonl"));
        let results: Vec<&serde_json::Value> = events
            .iter()
            .filter_map(|e| e["tool_results"].as_array())
            .flatten()
            .collect();
        assert_eq!(
            results.len(),
            1,
            "{provider}: the loop ended after one call"
        );
        assert_eq!(
            results[0]["result"],
            json!({"region": "north", "sales": 42}),
            "{provider}"
        );
        assert_eq!(mock.log().len(), 1, "{provider}: one model call");
    }
}
