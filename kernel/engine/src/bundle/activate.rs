//! Activating a skill: what `load_skill` returns and what an agent that is a skill starts
//! from.
//!
//! The `SKILL.md` is read again (it may have changed since the catalog was made) and checked;
//! its instructions get `{skill-root}`, `{skill-name}`, `{project-root}` and the config
//! values filled in (unknown names are kept). Then rlm does the activation steps BMAD's
//! skills ask a script for, so the model needs neither `uv` nor a shell: the customization
//! (`customize.toml` and its overrides) is merged, the `persistent_facts` of its block are
//! loaded, and a `workflow.md` the instructions name is read — rendered with the project's
//! values when the skill is one BMAD renders. The other files of the skill are listed, not
//! read: the model reads them with `read_file` when a step needs them, a bare relative path
//! resolving in the skill's folder (which loading the skill makes the first place looked).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::customize::Layers;
use super::error::BundleError;
use super::facts::{Fact, facts_text, load_facts};
use super::render::WORKFLOW_FILE;
use super::session::BundleSession;
use super::skill::{SKILL_FILE, Skill, SkillFile, no_skill};
use super::vars::Variables;

/// The most files of a skill listed as its resources.
const MAX_RESOURCES: usize = 200;

/// How deep below the skill's folder resources are listed.
const MAX_RESOURCE_DEPTH: usize = 4;

/// A skill, activated.
#[derive(Debug, Clone)]
pub(crate) struct Activation {
    /// The skill.
    pub(crate) skill: Skill,
    /// Its instructions, values filled in.
    pub(crate) instructions: String,
    /// Its customization, merged (when it has a `customize.toml`).
    pub(crate) customization: Option<Arc<Layers>>,
    /// The `persistent_facts` of its customization, loaded.
    pub(crate) facts: Vec<Fact>,
    /// The `workflow.md` its instructions name: path and text (rendered, values filled in).
    pub(crate) workflow: Option<(PathBuf, String)>,
    /// The other files of its folder, relative to it (at most 200).
    pub(crate) resources: Vec<String>,
}

/// Activates the skill named `name` of the session (files recorded as read `by`).
pub(crate) fn activate(
    session: &BundleSession,
    name: &str,
    by: &str,
) -> Result<Activation, BundleError> {
    let skills = session.skills();
    let skill = skills.get(name).ok_or_else(|| no_skill(name, skills))?;
    let file = SkillFile::read(session.sandbox(), &skill.dir, by)?;
    activate_file(session, file, by)
}

/// Activates the skill whose `SKILL.md` is already read as `file`.
pub(crate) fn activate_file(
    session: &BundleSession,
    file: SkillFile,
    by: &str,
) -> Result<Activation, BundleError> {
    let SkillFile { skill, body } = file;
    let vars = skill_variables(session.variables(), &skill);
    let customization = session.customization(&skill, by)?;
    let facts = customization
        .as_deref()
        .and_then(|layers| facts_of(layers))
        .map(|entries| {
            load_facts(
                entries,
                &vars,
                &session.roots().project,
                session.sandbox(),
                by,
            )
        })
        .unwrap_or_default();
    let workflow_path = skill.dir.join(WORKFLOW_FILE);
    let workflow = if body.contains(WORKFLOW_FILE) && workflow_path.is_file() {
        let (path, text) = session
            .sandbox()
            .read_text(&workflow_path.display().to_string(), by)?;
        let text = if skill.rendered {
            session.render(&skill, &text, by)?
        } else {
            text
        };
        Some((path, vars.resolve_lenient(&text)))
    } else {
        None
    };
    session.activate_skill(&skill.dir);
    Ok(Activation {
        instructions: vars.resolve_lenient(&body),
        resources: resources(&skill.dir),
        skill,
        customization,
        facts,
        workflow,
    })
}

/// The session's variables plus `{skill-root}` and `{skill-name}` of `skill`.
pub(crate) fn skill_variables(vars: &Variables, skill: &Skill) -> Variables {
    let mut vars = vars.clone();
    vars.set("skill-root", skill.dir.display().to_string());
    vars.set("skill-name", skill.name.clone());
    vars
}

/// The `persistent_facts` of the customization's block (`agent`, else `workflow`, else the
/// first that has some).
fn facts_of(layers: &Layers) -> Option<&[Value]> {
    fn of(block: &Value) -> Option<&[Value]> {
        block.get("persistent_facts")?.as_array().map(Vec::as_slice)
    }
    ["agent", "workflow"]
        .iter()
        .find_map(|key| layers.merged.get(*key).and_then(of))
        .or_else(|| layers.merged.values().find_map(of))
}

impl Activation {
    /// What the model is told about what rlm did, and how to go on.
    pub(crate) fn note(&self) -> String {
        let mut note = vec![format!(
            "Follow these instructions. A bare relative path in them (`references/guide.md`) \
             is a file of this skill, in `{}`: read it with `read_file` when a step needs it, \
             not before.",
            self.skill.dir.display()
        )];
        if let Some(layers) = &self.customization {
            let files: Vec<String> = layers
                .files
                .iter()
                .map(|f| format!("`{}`", f.display()))
                .collect();
            note.push(format!(
                "rlm has resolved this skill's customization, merged from {}: `customization` \
                 holds what its `{{agent.…}}` or `{{workflow.…}}` placeholders stand for. Where \
                 the instructions say to run `resolve_customization.py` (with `uv` or Python) \
                 or to merge the TOML files yourself, use these values instead.",
                files.join(", ")
            ));
        }
        if !self.facts.is_empty() {
            note.push(
                "Its persistent facts are loaded (`persistent_facts`): keep them in mind for \
                 the rest of the session."
                    .to_owned(),
            );
        }
        if let Some((path, _)) = &self.workflow {
            note.push(if self.skill.rendered {
                format!(
                    "rlm has rendered the workflow: `workflow` holds `{}` with the project's \
                     values filled in. Do not run `render_skill.py`: read and follow \
                     `workflow`, and read each step file it names with `read_file` (its values \
                     are filled in as it is read).",
                    path.display()
                )
            } else {
                format!(
                    "`workflow` holds `{}`, which the instructions name.",
                    path.display()
                )
            });
        }
        note.join(" ")
    }

    /// The activation as `load_skill` returns it.
    pub(crate) fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("skill".into(), json!(self.skill.name));
        out.insert("description".into(), json!(self.skill.description));
        out.insert("directory".into(), json!(self.skill.dir));
        out.insert("note".into(), json!(self.note()));
        out.insert("instructions".into(), json!(self.instructions));
        if let Some(layers) = &self.customization {
            out.insert(
                "customization".into(),
                json!({"files": layers.files, "values": layers.merged}),
            );
        }
        if !self.facts.is_empty() {
            out.insert("persistent_facts".into(), json!(facts_text(&self.facts)));
        }
        if let Some((path, content)) = &self.workflow {
            out.insert("workflow".into(), json!({"path": path, "content": content}));
        }
        out.insert("resources".into(), json!(self.resources));
        Value::Object(out)
    }
}

/// The files of the skill folder `dir` other than `SKILL.md` and `customize.toml`, relative
/// to it, sorted; hidden files and folders and `__pycache__` are left out.
fn resources(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![(dir.to_owned(), 0usize)];
    while let Some((folder, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok).take(MAX_RESOURCES) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "__pycache__" {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                if depth + 1 < MAX_RESOURCE_DEPTH {
                    stack.push((path, depth + 1));
                }
            } else if let Ok(rel) = path.strip_prefix(dir) {
                let rel = rel.display().to_string();
                if rel != SKILL_FILE && rel != "customize.toml" {
                    found.push(rel);
                }
            }
        }
    }
    found.sort();
    if found.len() > MAX_RESOURCES {
        found.truncate(MAX_RESOURCES);
        found.push("… (more files not listed)".to_owned());
    }
    found
}
