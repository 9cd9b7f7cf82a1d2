//! Workflow skills that BMAD renders: since 6.12 some skills (`bmad-build`) keep their
//! workflow in `workflow.md` and step files with placeholders, and their `SKILL.md` says to
//! run `render_skill.py`, which fills them in and writes a snapshot. rlm fills them in
//! itself, when the model loads the skill or reads one of its step files, and writes nothing:
//!
//! - `{{config.a.b}}`: the value at `a.b` of the project's central config;
//! - `{{.key}}`: the one value named `key` anywhere in the central config (two are an
//!   error: the reference is ambiguous);
//! - `{workflow.x}`: the skill's merged customization, shaped by its default — text as is, a
//!   list of texts as a Markdown list (`_None._` when empty), a list of tables with `id` as
//!   review-layer sections;
//! - `[[bmad-snapshot:file.md]]`: the path of that file in the skill's folder (reading it
//!   renders it in turn).
//!
//! `{project-root}` in a config value becomes the project's path. Values are inserted once:
//! a value is never scanned for placeholders itself. A missing value is an error that names
//! it, as the script's `HALT` does.

use std::path::Path;

use serde_json::{Map, Value};

use super::customize::{Layers, lookup};

/// The file a rendered workflow starts from.
pub(crate) const WORKFLOW_FILE: &str = "workflow.md";

/// Whether a skill's instructions say to render it (`render_skill.py`).
pub(crate) fn renders(instructions: &str) -> bool {
    instructions.contains("render_skill.py")
}

/// What a rendered file is filled in from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenderValues<'a> {
    /// The skill's folder.
    pub(crate) skill_dir: &'a Path,
    /// The project root.
    pub(crate) project: &'a Path,
    /// The central config, merged.
    pub(crate) config: Option<&'a Map<String, Value>>,
    /// The skill's customization, merged.
    pub(crate) customization: Option<&'a Layers>,
}

/// A placeholder found in a text: its kind, what it names, and where it ends.
enum Token<'t> {
    Config(&'t str),
    ShortConfig(&'t str),
    Workflow(&'t str),
    Snapshot(&'t str),
}

/// `text` with every placeholder filled in (see the module docs).
pub(crate) fn render(text: &str, values: &RenderValues<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['{', '[']) {
        out.push_str(&rest[..at]);
        let candidate = &rest[at..];
        match token(candidate) {
            Some((token, len)) => {
                out.push_str(&value_of(&token, values)?);
                rest = &candidate[len..];
            }
            None => {
                out.push_str(&candidate[..1]);
                rest = &candidate[1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The placeholder at the start of `text` and its length.
fn token(text: &str) -> Option<(Token<'_>, usize)> {
    let dotted = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let take = |prefix: &str, suffix: &str, allowed: &dyn Fn(char) -> bool| {
        let inner = text.strip_prefix(prefix)?;
        let end = inner.find(|c: char| !allowed(c))?;
        (end > 0 && inner[end..].starts_with(suffix))
            .then(|| (&inner[..end], prefix.len() + end + suffix.len()))
    };
    if let Some((name, len)) = take("{{config.", "}}", &dotted) {
        return Some((Token::Config(name), len));
    }
    if let Some((name, len)) = take("{{.", "}}", &plain) {
        return Some((Token::ShortConfig(name), len));
    }
    if let Some((name, len)) = take("{workflow.", "}", &dotted) {
        return Some((Token::Workflow(name), len));
    }
    if let Some((name, len)) = take("[[bmad-snapshot:", "]]", &path)
        && name.ends_with(".md")
    {
        return Some((Token::Snapshot(name), len));
    }
    None
}

fn value_of(token: &Token<'_>, values: &RenderValues<'_>) -> Result<String, String> {
    let config = || {
        values.config.ok_or_else(|| {
            "the project has no central config (`_bmad/config.toml`); install BMAD in the \
             project"
                .to_owned()
        })
    };
    match token {
        Token::Config(path) => {
            let value = lookup(config()?, path)
                .ok_or_else(|| format!("the central config has no value `{path}`"))?;
            config_text(value, path, values.project)
        }
        Token::ShortConfig(key) => {
            let mut found = Vec::new();
            find_values(config()?, key, "", &mut found);
            match found.as_slice() {
                [] => Err(format!("the central config has no value `{key}`")),
                [(path, value)] => config_text(value, path, values.project),
                _ => Err(format!(
                    "the central config value `{key}` is ambiguous: it is at {}",
                    found
                        .iter()
                        .map(|(p, _)| format!("`{p}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
        Token::Workflow(path) => {
            let layers = values.customization.ok_or_else(|| {
                format!("`{{workflow.{path}}}` needs the skill's `customize.toml`")
            })?;
            let full = format!("workflow.{path}");
            let value = layers
                .get(&full)
                .ok_or_else(|| format!("the customization has no value `{full}`"))?;
            let default = lookup(&layers.base, &full)
                .ok_or_else(|| format!("`customize.toml` has no default for `{full}`"))?;
            let text = customization_text(value, default, &full)?;
            Ok(text.replace("{skill-root}", &values.skill_dir.display().to_string()))
        }
        Token::Snapshot(name) => {
            let path = values.skill_dir.join(name);
            if name.split('/').any(|part| part == "..") || !path.is_file() {
                return Err(format!(
                    "`[[bmad-snapshot:{name}]]` names a file the skill does not have"
                ));
            }
            Ok(path.display().to_string())
        }
    }
}

/// Every non-table, non-list value named `key` in `table`, with its dotted path.
fn find_values<'a>(
    table: &'a Map<String, Value>,
    key: &str,
    prefix: &str,
    found: &mut Vec<(String, &'a Value)>,
) {
    for (name, value) in table {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        if name == key && !value.is_object() && !value.is_array() {
            found.push((path.clone(), value));
        }
        if let Value::Object(inner) = value {
            find_values(inner, key, &path, found);
        }
    }
}

/// A config value as text, `{project-root}` filled in.
fn config_text(value: &Value, path: &str, project: &Path) -> Result<String, String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(_) | Value::Bool(_) => value.to_string(),
        _ => return Err(format!("the config value `{path}` must be text")),
    };
    if text.trim().is_empty() {
        return Err(format!("the config value `{path}` is empty"));
    }
    Ok(text.replace("{project-root}", &project.display().to_string()))
}

/// A customization value as text, shaped by its default's type.
fn customization_text(value: &Value, default: &Value, path: &str) -> Result<String, String> {
    match default {
        Value::String(default) => {
            let Value::String(text) = value else {
                return Err(format!("`{path}` must be text"));
            };
            let may_be_empty = default.trim().is_empty() || path == "workflow.open_spec";
            if text.trim().is_empty() && !may_be_empty {
                return Err(format!("`{path}` must not be empty"));
            }
            Ok(text.clone())
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
            review_layers(value, path)
        }
        Value::Array(_) => {
            let Value::Array(items) = value else {
                return Err(format!("`{path}` must be a list"));
            };
            let mut lines = Vec::new();
            for item in items {
                let Value::String(text) = item else {
                    return Err(format!("the items of `{path}` must be text"));
                };
                let mut parts = text.lines();
                lines.push(format!("- {}", parts.next().unwrap_or_default()));
                lines.extend(parts.map(|line| format!("  {line}")));
            }
            Ok(if lines.is_empty() {
                "_None._".to_owned()
            } else {
                lines.join("\n")
            })
        }
        _ => Err(format!(
            "`{path}` has a default of a type that cannot be shown"
        )),
    }
}

/// Review layers (`[[workflow.review_layers]]` with `id`, `name`, `instruction`, `when`)
/// as sections; those without an instruction are left out.
fn review_layers(value: &Value, path: &str) -> Result<String, String> {
    let Value::Array(items) = value else {
        return Err(format!("`{path}` must be a list of tables"));
    };
    let mut sections = Vec::new();
    let mut seen = Vec::new();
    for item in items {
        let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::trim);
        let id = text("id")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| format!("an item of `{path}` has no `id`"))?;
        if seen.contains(&id) {
            return Err(format!("`{path}` has the id `{id}` twice"));
        }
        seen.push(id);
        let instruction = text("instruction").unwrap_or_default();
        if instruction.is_empty() {
            continue;
        }
        let mut section = format!("#### {} (`{id}`)", text("name").unwrap_or(id));
        if let Some(when) = text("when") {
            section.push_str(&format!("\n\nRun only when: {when}"));
        }
        section.push_str(&format!("\n\n{instruction}"));
        sections.push(section);
    }
    Ok(if sections.is_empty() {
        "No active review layers. HALT with blocking condition `no active review layers`."
            .to_owned()
    } else {
        sections.join("\n\n")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_are_filled_in_once_from_config_and_customization() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("step-02.md"), "next").expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        let config = json!({
            "core": {"communication_language": "English"},
            "modules": {"bmm": {"implementation_artifacts": "{project-root}/out"}},
        });
        let Value::Object(config) = config else {
            panic!()
        };
        let Value::Object(base) = json!({"workflow": {
            "persistent_facts": [], "on_complete": "", "open_spec": "",
            "review_layers": [{"id": "x", "instruction": ""}],
        }}) else {
            panic!()
        };
        let Value::Object(merged) = json!({"workflow": {
            "persistent_facts": ["Two\nlines", "{workflow.on_complete} stays"],
            "on_complete": "", "open_spec": "",
            "review_layers": [{"id": "x", "name": "Edge", "instruction": "Hunt edges in {skill-root}.", "when": "always"}],
        }}) else {
            panic!()
        };
        let layers = Layers {
            files: Vec::new(),
            base,
            merged,
        };
        let values = RenderValues {
            skill_dir: dir.path(),
            project: Path::new("/p"),
            config: Some(&config),
            customization: Some(&layers),
        };
        let text = "Speak {{.communication_language}}; save to {{config.modules.bmm.implementation_artifacts}}.\nFacts:\n{workflow.persistent_facts}\nLayers:\n{workflow.review_layers}\nNext: [[bmad-snapshot:step-02.md]]; keep {project-root} and {{name}}.";
        let rendered = render(text, &values).expect("renders");
        assert_eq!(
            rendered,
            format!(
                "Speak English; save to /p/out.\nFacts:\n- Two\n  lines\n- {{workflow.on_complete}} stays\nLayers:\n#### Edge (`x`)\n\nRun only when: always\n\nHunt edges in {0}.\nNext: {0}/step-02.md; keep {{project-root}} and {{{{name}}}}.",
                dir.path().display()
            )
        );
        for (text, error) in [
            ("{{.missing}}", "the central config has no value `missing`"),
            (
                "{workflow.nothing}",
                "the customization has no value `workflow.nothing`",
            ),
            (
                "[[bmad-snapshot:gone.md]]",
                "names a file the skill does not have",
            ),
        ] {
            let err = render(text, &values).expect_err(text);
            assert!(err.contains(error), "{text}: {err}");
        }
    }
}
