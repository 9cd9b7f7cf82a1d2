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
    use super::*;

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
