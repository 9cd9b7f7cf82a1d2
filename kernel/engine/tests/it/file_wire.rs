//! What a workflow file sets reaches the wire: an `LlmAgent`'s `generate_content_config`
//! becomes the request's sampling fields over both wire formats, and `include_contents:
//! none` from a file sends only the instruction and the current input.

use bridge::Provider;
use bridge::mock::MockServer;
use engine::flow::file::{EmbeddedFiles, load_workflow_from};
use engine::flow::{Registry, RunOutcome};
use serde_json::{Value, json};

use crate::llm::mock;
use crate::workflow::{endpoints, run};

/// The JSON body of every recorded request, in order.
fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .log()
        .entries()
        .iter()
        .map(|e| serde_json::from_str(e.body.as_deref().expect("a body")).expect("JSON"))
        .collect()
}

const FILES: [(&str, &str); 3] = [
    (
        "root.yaml",
        "agent_class: SequentialAgent\nname: root\nsub_agents:\n  - config_path: tuned.yaml\n  - config_path: fresh.yaml\n",
    ),
    (
        "tuned.yaml",
        "name: tuned
model: tuned
instruction: Draft it.
output_key: draft
generate_content_config:
  temperature: 0.25
  top_p: 0.5
  max_output_tokens: 321
  stop_sequences: [END]
  seed: 7
",
    ),
    (
        "fresh.yaml",
        "name: fresh
model: fresh
instruction: 'Judge {draft} alone.'
include_contents: none
output_key: verdict
",
    ),
];

#[tokio::test]
async fn generation_settings_and_include_contents_from_a_file_reach_the_wire() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let server = mock(json!({
            "tuned": {"replies": ["a draft"]},
            "fresh": {"replies": ["fine"]},
        }))
        .await;
        let files = FILES
            .iter()
            .fold(EmbeddedFiles::new(), |acc, (path, text)| {
                acc.with(*path, *text)
            });
        let spec = load_workflow_from(&files, "root.yaml").expect("valid files");
        let endpoints = endpoints(&server, provider, &["tuned", "fresh"]);
        let root = Registry::new(endpoints.clone(), "tuned")
            .build(&spec)
            .expect("builds");
        let (report, _) = run(root.as_ref(), &endpoints, "the user's request").await;
        assert_eq!(report.outcome(), RunOutcome::Completed, "{provider:?}");
        assert_eq!(report.state.get("verdict"), Some(&json!("fine")));

        let [tuned, fresh] = <[Value; 2]>::try_from(bodies(&server)).expect("two requests");
        // `generate_content_config`, in each wire format's own field names.
        assert_eq!(tuned["temperature"], json!(0.25), "{provider:?}");
        assert_eq!(tuned["top_p"], json!(0.5), "{provider:?}");
        assert_eq!(tuned["max_tokens"], json!(321), "{provider:?}");
        let stop = match provider {
            Provider::OpenAi => {
                assert_eq!(tuned["seed"], json!(7));
                &tuned["stop"]
            }
            Provider::Anthropic => &tuned["stop_sequences"],
        };
        assert_eq!(stop, &json!(["END"]), "{provider:?}");
        // An agent without settings sends none of them.
        for key in ["temperature", "top_p", "seed", "stop", "stop_sequences"] {
            assert!(fresh.get(key).is_none(), "{provider:?}: {key} in {fresh}");
        }
        // `include_contents: none`: the instruction and the current input, not `tuned`'s
        // turn (which an agent with the default sees as `[tuned] said: ...`).
        let text = fresh.to_string();
        assert!(text.contains("Judge a draft alone."), "{text}");
        assert!(text.contains("the user's request"), "{text}");
        assert!(!text.contains("[tuned] said"), "{provider:?}: {text}");
        server.shutdown().await;
    }
}
