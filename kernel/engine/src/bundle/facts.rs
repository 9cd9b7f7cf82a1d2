//! Persistent facts: what a BMAD agent or workflow keeps in mind for the whole session
//! (`persistent_facts` of its customization).
//!
//! An entry is a sentence kept as written, `file:PATH` — a path or a glob (`*`, `**`, `?`,
//! `[…]`, `{a,b}`) under the project, its variables filled in, a relative one starting at
//! the project root — whose files are loaded as facts, or `skill:NAME`, a skill to load when
//! its knowledge is needed. Globs are matched while walking the folder above the first
//! wildcard, without following links or entering version-control folders and
//! `node_modules`, and within bounds ([`MAX_VISITED`] entries, [`MAX_FILES`] files); every
//! file is read through the sandbox, so a glob cannot reach outside the read roots. A file
//! that is missing or refused is reported with the fact, not fatal: the model is told what
//! could not be loaded.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::sandbox::{Sandbox, is_vcs_folder};
use super::vars::Variables;

/// The most directory entries one glob looks at.
pub(crate) const MAX_VISITED: usize = 20_000;

/// The most files one glob loads.
pub(crate) const MAX_FILES: usize = 50;

/// How deep below its base folder a glob looks.
const MAX_DEPTH: usize = 16;

/// One persistent fact, loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub(crate) enum Fact {
    /// A sentence, as written.
    Text {
        /// The sentence.
        text: String,
    },
    /// A `file:` entry and the files it matched.
    Files {
        /// The entry as written (without `file:`).
        pattern: String,
        /// The files loaded: canonical path and text.
        files: Vec<FactFile>,
        /// What could not be loaded (no match, a refused or unreadable file).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        problems: Vec<String>,
    },
    /// A `skill:` entry: a skill whose knowledge the model loads when it needs it.
    Skill {
        /// The skill (and any text after its name).
        skill: String,
    },
}

/// One file of a `file:` fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FactFile {
    /// Its canonical path.
    pub(crate) path: PathBuf,
    /// Its text.
    pub(crate) content: String,
}

/// Loads `entries` (the `persistent_facts` array) for the project at `project`, filling in
/// `vars`, reading through `sandbox` (recorded as read `by`).
pub(crate) fn load_facts(
    entries: &[Value],
    vars: &Variables,
    project: &Path,
    sandbox: &Sandbox,
    by: &str,
) -> Vec<Fact> {
    entries
        .iter()
        .map(|entry| {
            let text = match entry {
                Value::String(text) => text.trim().to_owned(),
                other => other.to_string(),
            };
            if let Some(pattern) = text.strip_prefix("file:") {
                load_file_fact(pattern.trim(), vars, project, sandbox, by)
            } else if let Some(skill) = text.strip_prefix("skill:") {
                Fact::Skill {
                    skill: skill.trim().to_owned(),
                }
            } else {
                Fact::Text { text }
            }
        })
        .collect()
}

fn load_file_fact(
    pattern: &str,
    vars: &Variables,
    project: &Path,
    sandbox: &Sandbox,
    by: &str,
) -> Fact {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    match vars.resolve(pattern) {
        Err(e) => problems.push(e.to_string()),
        Ok(resolved) => {
            let absolute = if Path::new(&resolved).is_absolute() {
                PathBuf::from(&resolved)
            } else {
                project.join(&resolved)
            };
            match expand(&absolute) {
                Err(problem) => problems.push(problem),
                Ok(paths) if paths.is_empty() => {
                    problems.push(format!("No file matches `{}`", absolute.display()));
                }
                Ok(paths) => {
                    for path in paths {
                        match sandbox.read_text(&path.display().to_string(), by) {
                            Ok((path, content)) => files.push(FactFile { path, content }),
                            Err(e) => problems.push(e.to_string()),
                        }
                    }
                }
            }
        }
    }
    Fact::Files {
        pattern: pattern.to_owned(),
        files,
        problems,
    }
}

/// The files `pattern` (absolute) names: itself when it has no wildcard, else the matches,
/// sorted, at most [`MAX_FILES`].
fn expand(pattern: &Path) -> Result<Vec<PathBuf>, String> {
    let text = pattern.display().to_string();
    if !text.contains(['*', '?', '[', '{']) {
        return Ok(vec![pattern.to_owned()]);
    }
    let matcher = globset::GlobBuilder::new(&text)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("`{text}` is not a valid glob: {e}"))?
        .compile_matcher();
    // The folder above the first component with a wildcard.
    let mut base = PathBuf::new();
    for component in pattern.components() {
        if component
            .as_os_str()
            .to_string_lossy()
            .contains(['*', '?', '[', '{'])
        {
            break;
        }
        base.push(component);
    }
    let mut found = Vec::new();
    let mut visited = 0usize;
    let mut stack = vec![(base, 0usize)];
    while let Some((folder, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            visited += 1;
            if visited > MAX_VISITED {
                return Err(format!(
                    "`{text}` looks at more than {MAX_VISITED} files and folders; name a \
                     narrower folder"
                ));
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                let name = entry.file_name();
                if depth < MAX_DEPTH && !is_vcs_folder(&name) && name != "node_modules" {
                    stack.push((path, depth + 1));
                }
            } else if matcher.is_match(&path) {
                found.push(path);
            }
        }
    }
    found.sort();
    if found.len() > MAX_FILES {
        return Err(format!(
            "`{text}` matches {} files, more than the {MAX_FILES} a fact may load; name \
             fewer",
            found.len()
        ));
    }
    Ok(found)
}

/// The facts as the model reads them: a sentence per line, each file's text under its path,
/// and what could not be loaded.
pub(crate) fn facts_text(facts: &[Fact]) -> String {
    if facts.is_empty() {
        return "(none)".to_owned();
    }
    let mut out = Vec::new();
    for fact in facts {
        match fact {
            Fact::Text { text } => out.push(format!("- {text}")),
            Fact::Skill { skill } => out.push(format!(
                "- The skill `{skill}`: load it with `load_skill` when its knowledge is needed."
            )),
            Fact::Files {
                pattern,
                files,
                problems,
            } => {
                for file in files {
                    out.push(format!(
                        "- From `{}` (`file:{pattern}`):\n\n{}\n",
                        file.path.display(),
                        file.content.trim_end()
                    ));
                }
                for problem in problems {
                    out.push(format!("- `file:{pattern}` could not be loaded: {problem}"));
                }
            }
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sentences_files_globs_and_skills_load_and_problems_are_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        for (rel, text) in [
            ("docs/standards.md", "Use SI units."),
            ("a/project-context.md", "Context A"),
            ("b/c/project-context.md", "Context C"),
            (".git/project-context.md", "never"),
            ("node_modules/x/project-context.md", "never"),
        ] {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
        let sandbox = Sandbox::new(std::slice::from_ref(&root), &root, &root).expect("sandbox");
        let mut vars = Variables::new();
        vars.set("project-root", root.display().to_string());
        let facts = load_facts(
            &[
                json!("Our org is AWS-only."),
                json!("file:{project-root}/docs/standards.md"),
                json!("file:**/project-context.md"),
                json!("file:{project-root}/missing.md"),
                json!("file:/etc/hostname"),
                json!("skill:acme-terms"),
            ],
            &vars,
            &root,
            &sandbox,
            "start-up",
        );
        assert_eq!(
            facts[0],
            Fact::Text {
                text: "Our org is AWS-only.".to_owned()
            }
        );
        let contents = |fact: &Fact| match fact {
            Fact::Files { files, .. } => files.iter().map(|f| f.content.clone()).collect(),
            _ => Vec::new(),
        };
        assert_eq!(contents(&facts[1]), ["Use SI units."]);
        assert_eq!(contents(&facts[2]), ["Context A", "Context C"]);
        let problems = |fact: &Fact| match fact {
            Fact::Files { problems, .. } => problems.join(" "),
            _ => String::new(),
        };
        assert!(
            problems(&facts[3]).ends_with("missing.md` does not exist"),
            "{facts:?}"
        );
        assert!(
            problems(&facts[4]).contains("is outside the folders"),
            "{facts:?}"
        );
        assert_eq!(
            facts[5],
            Fact::Skill {
                skill: "acme-terms".to_owned()
            }
        );
        assert_eq!(sandbox.log().len(), 3, "only the files loaded were read");
        let text = facts_text(&facts);
        assert!(text.contains("- Our org is AWS-only.\n- From `"), "{text}");
    }
}
