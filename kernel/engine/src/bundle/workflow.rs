//! `workflow.yaml`: a workflow's variables and the files it names, loaded in one go for the
//! `execute_workflow` tool.
//!
//! Variables resolve in this order: the agent's (roots, date, its config), then the
//! workflow's own keys, which may refer to each other (`default_output_file:
//! "{status_file}"`) and to a config (`user_name: "{config_source}:user_name"`).
//! `date: system-generated` is today's date. The values the model passes in `user_input`
//! (what the user answered or chose) come last and win, except over the agent's own roots and
//! date; its `data` names a data file to load. The workflow then loads its `instructions`
//! (variables filled in, unknown ones kept), its `template` (as written: its `{{…}}`
//! placeholders are the model's to fill) and every other value that names a file inside the
//! workflow's folder (data such as a CSV of methods, a checklist). Globs and files elsewhere
//! are left for the model to load when a step needs them.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::error::{BundleError, VariableError};
use super::session::BundleSession;
use super::vars::Variables;
use super::yaml;

/// Names the workflow may not redefine: they are the agent's.
const FIXED: [&str; 5] = [
    "project-root",
    "project_root",
    "bundle-root",
    "core-root",
    "date",
];

/// Keys whose files are loaded under their own heading, or that name no file to load.
const NOT_DATA: [&str; 5] = [
    "instructions",
    "template",
    "config_source",
    "installed_path",
    "default_output_file",
];

/// Loads the workflow at `path` (variables allowed) and what it names, with the values of
/// `user_input` (its `data`: a file the command passes along). Returns the workflow context
/// the model works from.
pub(crate) fn load_workflow(
    session: &BundleSession,
    path: &str,
    user_input: &Map<String, Value>,
    by: &str,
) -> Result<Value, BundleError> {
    let sandbox = session.sandbox();
    let path = session.variables().resolve(path)?;
    let (file, text) = sandbox.read_text(&path, by)?;
    let entries = yaml::parse_mapping(&file, &text)?;
    let folder = file.parent().unwrap_or(&file).to_owned();
    let mut vars = workflow_variables(session, &file, &folder, &entries, by)?;
    for (key, value) in user_input {
        if FIXED.contains(&key.as_str()) {
            return Err(BundleError::WorkflowValue {
                path: file.clone(),
                key: format!("user_input.{key}"),
                problem: format!(
                    "cannot be set: `{{{key}}}` is the agent's own; leave it out of `user_input`"
                ),
            });
        }
        if let Some(text) = yaml::scalar_text(value) {
            vars.set(key.clone(), text);
        }
    }
    let data = user_input.get("data").and_then(Value::as_str);

    let mut variables = Map::new();
    for (key, value) in &entries {
        let resolved = if FIXED.contains(&key.as_str()) {
            // The agent's own value wins (`date: system-generated` is today).
            match vars.value(key) {
                Some(value) => Value::String(value?),
                None => continue,
            }
        } else if let (Value::String(_), Some(value)) = (value, vars.value(key)) {
            // Already looked up (`{config_source}:key`) or a plain text value.
            Value::String(value.map_err(|e| value_error(&file, key, &e))?)
        } else {
            resolve_value(&vars, value).map_err(|e| value_error(&file, key, &e))?
        };
        variables.insert(key.clone(), resolved);
    }
    let text_of = |key: &str| {
        variables
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };

    let instructions = text_of("instructions").ok_or_else(|| BundleError::WorkflowValue {
        path: file.clone(),
        key: "instructions".to_owned(),
        problem: "is missing; a workflow names its instructions file".to_owned(),
    })?;
    let (instructions_path, instructions) = sandbox.read_text(&instructions, by)?;
    let mut context = Map::new();
    context.insert(
        "workflow".into(),
        json!(text_of("name").unwrap_or_default()),
    );
    context.insert(
        "description".into(),
        json!(text_of("description").unwrap_or_default()),
    );
    context.insert("path".into(), json!(file));
    if let Some(output) = text_of("default_output_file") {
        context.insert("default_output_file".into(), json!(output));
    }
    context.insert(
        "instructions".into(),
        json!({"path": instructions_path, "content": vars.resolve_lenient(&instructions)}),
    );
    if let Some(template) = text_of("template").filter(|t| !t.is_empty()) {
        let (template_path, content) = sandbox.read_text(&template, by)?;
        context.insert(
            "template".into(),
            json!({"path": template_path, "content": content}),
        );
    }
    let folder = sandbox.check_read(&folder.display().to_string())?;
    let mut files = Vec::new();
    for (key, value) in &variables {
        let Some(candidate) = value.as_str() else {
            continue;
        };
        if NOT_DATA.contains(&key.as_str())
            || !in_folder(session, candidate, &folder)
            || !sandbox.is_readable_file(candidate)
        {
            continue;
        }
        let (data_path, content) = sandbox.read_text(candidate, by)?;
        files.push(json!({"key": key, "path": data_path, "content": content}));
    }
    if !files.is_empty() {
        context.insert("files".into(), Value::Array(files));
    }
    if let Some(data) = data.filter(|d| !d.trim().is_empty()) {
        let data = vars.resolve(data)?;
        let (data_path, content) = sandbox.read_text(&data, by)?;
        context.insert(
            "data".into(),
            json!({"path": data_path, "content": content}),
        );
    }
    if !user_input.is_empty() {
        context.insert("user_input".into(), Value::Object(user_input.clone()));
    }
    context.insert("variables".into(), Value::Object(variables));
    Ok(Value::Object(context))
}

/// The agent's variables plus the workflow's keys, `{config_source}:key` looked up.
fn workflow_variables(
    session: &BundleSession,
    file: &Path,
    folder: &Path,
    entries: &yaml::Entries,
    by: &str,
) -> Result<Variables, BundleError> {
    let mut vars = session.variables().clone();
    vars.set("installed_path", folder.display().to_string());
    let mut references = Vec::new();
    for (key, value) in entries {
        let Some(text) = yaml::scalar_text(value) else {
            continue;
        };
        if FIXED.contains(&key.as_str()) || text == "system-generated" {
            continue;
        }
        match config_reference(&text) {
            Some((source, config_key)) => {
                references.push((key, text.clone(), source.to_owned(), config_key.to_owned()));
            }
            None => vars.set(key.clone(), text),
        }
    }
    for (key, reference, source, config_key) in references {
        let config = vars
            .resolve(&format!("{{{source}}}"))
            .map_err(|e| value_error(file, key, &e))?;
        let value = session.config_value(&config, &config_key, &reference, by)?;
        vars.set(key.clone(), value);
    }
    Ok(vars)
}

/// `{config_source}:user_name` → (`config_source`, `user_name`).
fn config_reference(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix('{')?;
    let (source, rest) = rest.split_once('}')?;
    let key = rest.strip_prefix(':')?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    (plain(source) && plain(key)).then_some((source, key))
}

/// `value` with every string in it resolved.
fn resolve_value(vars: &Variables, value: &Value) -> Result<Value, VariableError> {
    Ok(match value {
        Value::String(s) => Value::String(vars.resolve(s)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| resolve_value(vars, v))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), resolve_value(vars, v)?)))
                .collect::<Result<_, VariableError>>()?,
        ),
        other => other.clone(),
    })
}

fn in_folder(session: &BundleSession, candidate: &str, folder: &PathBuf) -> bool {
    session
        .sandbox()
        .check_read(candidate)
        .is_ok_and(|p| p.starts_with(folder))
}

fn value_error(file: &Path, key: &str, err: &VariableError) -> BundleError {
    BundleError::WorkflowValue {
        path: file.to_owned(),
        key: key.to_owned(),
        problem: format!("cannot be resolved: {err}"),
    }
}
