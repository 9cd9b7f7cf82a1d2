//! The built-in workflows, compiled into the binary from `kernel/cli/flows/` (each also a
//! readable folder of YAML and Python files there).

use engine::flow::file::EmbeddedFiles;

/// One built-in workflow: its name, its root file and every file it reads.
pub(crate) struct Builtin {
    /// What `rlm flow run NAME` calls it.
    pub(crate) name: &'static str,
    /// The root file, relative to `flows/`.
    pub(crate) root: &'static str,
    /// Every file, relative to `flows/`, with its text.
    pub(crate) files: &'static [(&'static str, &'static str)],
}

macro_rules! files {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("../../flows/", $path)))),*]
    };
}

/// The built-in workflows, in the order `rlm flow list` shows them.
pub(crate) const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "rlm-completion",
        root: "rlm-completion/rlm-completion.yaml",
        files: files![
            "rlm-completion/rlm-completion.yaml",
            "rlm-completion/load_contexts.yaml",
            "rlm-completion/analyst.yaml",
            "rlm-completion/formatter.yaml",
            "rlm-completion/completion.py",
        ],
    },
    Builtin {
        name: "refine",
        root: "refine/refine.yaml",
        files: files![
            "refine/refine.yaml",
            "refine/save_inputs.yaml",
            "refine/refinement_loop.yaml",
            "refine/pruner.yaml",
            "refine/filler.yaml",
            "refine/enricher.yaml",
            "refine/evaluator.yaml",
            "refine/save_document.yaml",
            "refine/refine.py",
        ],
    },
    Builtin {
        name: "plan-discover",
        root: "plan-discover/plan-discover.yaml",
        files: files![
            "plan-discover/plan-discover.yaml",
            "plan-discover/planner.yaml",
            "plan-discover/discovery.yaml",
            "plan-discover/discoverer.yaml",
            "plan-discover/results_processor.yaml",
            "plan-discover/bundle/config.yaml",
            "plan-discover/bundle/agents/planner.md",
            "plan-discover/bundle/workflows/discovery-plan/workflow.yaml",
            "plan-discover/bundle/workflows/discovery-plan/instructions.md",
            "plan-discover/bundle/workflows/discovery-plan/template.md",
        ],
    },
    Builtin {
        name: "team",
        root: "team/team.yaml",
        files: files![
            "team/team.yaml",
            "team/analyst.yaml",
            "team/pm.yaml",
            "team/architect.yaml",
            "team/dev.yaml",
            "team/tea.yaml",
        ],
    },
];

impl Builtin {
    /// The built-in called `name`.
    pub(crate) fn find(name: &str) -> Option<&'static Builtin> {
        BUILTINS.iter().find(|b| b.name == name)
    }

    /// Its files, for reading without touching the disk.
    pub(crate) fn embedded(&self) -> EmbeddedFiles {
        self.files
            .iter()
            .fold(EmbeddedFiles::new(), |files, (path, text)| {
                files.with(*path, *text)
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bridge::mock::{MockConfig, MockServer, Script};
    use bridge::{EndpointConfig, Endpoints, Ledger};
    use engine::flow::file::load_workflow_from;
    use engine::flow::{EventKind, Invocation, MemorySink, Registry, run_workflow};
    use engine::{SharedState, State};
    use kernel::flow::{FlowKernel, register};
    use kernel::repl::SessionConfig;
    use serde_json::{Value, json};

    use super::*;

    /// `team` runs (without checkpoints) against its demo script: dev and tea disagree on the
    /// pm's story until the router sees a 4th exchange, and escalates.
    #[test]
    fn the_team_escalates_to_a_human_on_circular_logic_with_its_demo_script() {
        let team = Builtin::find("team").expect("a built-in");
        let spec = load_workflow_from(&team.embedded(), team.root).expect("team loads");
        let runtime = kernel::runtime::shared();
        let script = Script::from_json_str(include_str!("demo/team.json")).expect("script");
        let server = runtime
            .block_on(MockServer::start(MockConfig {
                script,
                ..MockConfig::default()
            }))
            .expect("mock server starts");
        let config = EndpointConfig::openai(
            kernel::options::ROOT,
            server.openai_base_url(),
            "demo-model",
        );
        let endpoints =
            Arc::new(Endpoints::new(vec![config], Arc::new(Ledger::default())).expect("endpoints"));
        let kernel = Arc::new(FlowKernel::new(
            Arc::clone(&endpoints),
            SessionConfig::default(),
            Vec::new(),
        ));
        let registry = register(
            Registry::new(Arc::clone(&endpoints), kernel::options::ROOT),
            &kernel,
            std::path::Path::new("team"),
        );
        let root = registry.build(&spec).expect("team builds");
        let mut state = State::default();
        state.set("request", json!("Export the report table as CSV."));
        let sink = MemorySink::new();
        let invocation = Invocation::new(SharedState::new(state)).with_sink(Arc::new(sink.clone()));
        let report = runtime.block_on(run_workflow(root.as_ref(), invocation, None));
        runtime.block_on(server.shutdown());
        assert!(report.result.is_ok(), "{:?}", report.result);
        let started: Vec<String> = sink
            .events()
            .iter()
            .filter(|e| e.kind == EventKind::Start)
            .map(|e| e.author.clone())
            .collect();
        assert_eq!(
            started,
            [
                "team",
                "analyst",
                "pm",
                "architect",
                "dev",
                "tea",
                "dev",
                "tea",
                "dev"
            ]
        );
        let state = &report.state;
        assert_eq!(state.get("circular_logic_detected"), Some(&json!(true)));
        assert_eq!(state.get("escalation_triggered"), Some(&json!(true)));
        assert_eq!(state.get("exchange_count"), Some(&json!(4)));
        assert_eq!(state.get("routing_decision"), Some(&json!("ESCALATE")));
        let story = json!("Story 1: export the report table as CSV");
        let messages = state
            .get("messages")
            .and_then(Value::as_array)
            .expect("messages");
        assert_eq!(messages.len(), 8);
        assert_eq!(
            messages[0]["topic"],
            Value::Null,
            "before the pm wrote the story"
        );
        assert!(messages[1..].iter().all(|m| m["topic"] == story));
        assert_eq!(
            state.get("routing_rationale"),
            Some(&json!(
                "Circular logic: `dev` and `tea` exchanged work 4 times on `Story 1: export the \
                 report table as CSV` (more than 3); a human must decide"
            ))
        );
    }

    /// Every file under `flows/` is compiled in, and every file compiled in is there.
    #[test]
    fn the_built_ins_hold_every_file_of_their_folders() {
        fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("a folder of flows/") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    walk(&path, root, out);
                } else {
                    let rel = path.strip_prefix(root).expect("under flows/");
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("flows");
        let mut on_disk = Vec::new();
        walk(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut compiled: Vec<String> = BUILTINS
            .iter()
            .flat_map(|b| b.files.iter().map(|(path, _)| (*path).to_owned()))
            .collect();
        compiled.sort();
        assert_eq!(compiled, on_disk);
    }
}
