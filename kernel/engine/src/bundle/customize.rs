//! BMAD's customization layers, merged here rather than by its `resolve_customization.py`
//! (so a project needs neither `uv` nor Python for it).
//!
//! A skill ships its defaults in `customize.toml` (an `[agent]` or `[workflow]` block); the
//! team overrides them in `_bmad/custom/<skill>.toml` and each person in
//! `_bmad/custom/<skill>.user.toml`, merged in that order. The project's central config is
//! four layers: `_bmad/config.toml`, `_bmad/config.user.toml`, `_bmad/custom/config.toml`,
//! `_bmad/custom/config.user.toml`. A missing layer is skipped; a present one that is not
//! valid TOML is an error naming the file and the line.
//!
//! The merge goes by the shape of the values, never by their names ([`merge`]): a scalar of
//! the later layer wins; tables merge key by key, recursively; an array of tables that all
//! have a `code` (or all an `id`) merges by that key — an item with a known key replaces it in
//! place, a new one is appended; any other array is appended to. Values are turned into JSON
//! (a TOML date-time becomes its text), which is what the model is shown.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::{BundleError, PathError};
use super::sandbox::Sandbox;
use crate::document;

/// The keys an array of tables may be merged by, in order of preference.
const KEYED_MERGE_FIELDS: [&str; 2] = ["code", "id"];

/// Layers of TOML merged into one table.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Layers {
    /// The files merged, first (the base) to last (the winner); missing ones are left out.
    pub(crate) files: Vec<PathBuf>,
    /// The first layer alone (a skill's own `customize.toml`): its defaults.
    pub(crate) base: Map<String, Value>,
    /// The merged table.
    pub(crate) merged: Map<String, Value>,
}

impl Layers {
    /// The merged value at the dotted `path` (`agent.icon`), if there is one.
    pub(crate) fn get(&self, path: &str) -> Option<&Value> {
        lookup(&self.merged, path)
    }
}

/// The value at the dotted `path` of `table`.
pub(crate) fn lookup<'a>(table: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut current = table.get(parts.next()?)?;
    for part in parts {
        current = current.as_object()?.get(part)?;
    }
    Some(current)
}

/// The customization of the skill in `skill_dir`: its `customize.toml` merged with the
/// team's and the user's overrides in `project`'s `_bmad/custom/`; `None` when the skill has
/// no `customize.toml`. Files are read through `sandbox`, recorded as read `by`.
pub(crate) fn load_customization(
    sandbox: &Sandbox,
    skill_dir: &Path,
    project: &Path,
    by: &str,
) -> Result<Option<Layers>, BundleError> {
    let name = skill_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let custom = project.join("_bmad").join("custom");
    let paths = [
        skill_dir.join("customize.toml"),
        custom.join(format!("{name}.toml")),
        custom.join(format!("{name}.user.toml")),
    ];
    let Some(base) = read_layer(sandbox, &paths[0], by)? else {
        return Ok(None);
    };
    let mut layers = vec![base];
    for path in &paths[1..] {
        layers.extend(read_layer(sandbox, path, by)?);
    }
    merge_layers(&name, layers).map(Some)
}

/// The central config of `project` (its four layers merged); `None` when it has none.
pub(crate) fn load_central_config(
    sandbox: &Sandbox,
    project: &Path,
    by: &str,
) -> Result<Option<Layers>, BundleError> {
    let bmad = project.join("_bmad");
    let paths = [
        bmad.join("config.toml"),
        bmad.join("config.user.toml"),
        bmad.join("custom").join("config.toml"),
        bmad.join("custom").join("config.user.toml"),
    ];
    let mut layers = Vec::new();
    for path in &paths {
        layers.extend(read_layer(sandbox, path, by)?);
    }
    if layers.is_empty() {
        return Ok(None);
    }
    merge_layers("config", layers).map(Some)
}

/// Merges `layers` (path and table, base first) of `what` (a skill's name, or `config`).
fn merge_layers(
    what: &str,
    layers: Vec<(PathBuf, Map<String, Value>)>,
) -> Result<Layers, BundleError> {
    let files: Vec<PathBuf> = layers.iter().map(|(path, _)| path.clone()).collect();
    let base = layers.first().map(|(_, t)| t.clone()).unwrap_or_default();
    let mut merged = Map::new();
    for (_, table) in layers {
        merged = merge_tables(merged, table).map_err(|problem| BundleError::Customization {
            skill: what.to_owned(),
            files: files.clone(),
            problem,
        })?;
    }
    Ok(Layers {
        files,
        base,
        merged,
    })
}

/// One layer: its file and its table.
type Layer = (PathBuf, Map<String, Value>);

/// The TOML file at `path` as a JSON table; `None` when there is no file.
fn read_layer(sandbox: &Sandbox, path: &Path, by: &str) -> Result<Option<Layer>, BundleError> {
    let (file, text) = match sandbox.read_text(&path.display().to_string(), by) {
        Ok(read) => read,
        Err(PathError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let table: toml::Table = document::from_toml(&text).map_err(|e| BundleError::Malformed {
        path: file.clone(),
        line: e.line,
        problem: if e.limit {
            e.message
        } else {
            format!("This is not valid TOML: {}", e.message)
        },
    })?;
    let Value::Object(table) = toml_to_json(toml::Value::Table(table)) else {
        return Ok(Some((file, Map::new())));
    };
    Ok(Some((file, table)))
}

/// A TOML value as JSON (a date-time becomes its text; a float that JSON cannot hold, null).
fn toml_to_json(value: toml::Value) -> Value {
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(items.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(k, v)| (k, toml_to_json(v)))
                .collect(),
        ),
    }
}

/// `over` merged onto `base` by BMAD's structural rules (see the module docs); the error says
/// why an array cannot be merged by its key.
pub(crate) fn merge(base: Value, over: Value) -> Result<Value, String> {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => merge_tables(base, over).map(Value::Object),
        (Value::Array(base), Value::Array(over)) => merge_arrays(base, over).map(Value::Array),
        (_, over) => Ok(over),
    }
}

/// The table `over` merged onto the table `base`, key by key.
fn merge_tables(
    mut base: Map<String, Value>,
    over: Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    for (key, value) in over {
        let merged = match base.remove(&key) {
            Some(existing) => {
                merge(existing, value).map_err(|problem| format!("in `{key}`: {problem}"))?
            }
            None => value,
        };
        base.insert(key, merged);
    }
    Ok(base)
}

fn merge_arrays(base: Vec<Value>, over: Vec<Value>) -> Result<Vec<Value>, String> {
    let all: Vec<&Value> = base.iter().chain(&over).collect();
    let Some(key) = keyed_field(&all)? else {
        let mut merged = base;
        merged.extend(over);
        return Ok(merged);
    };
    let mut merged: Vec<Value> = Vec::with_capacity(base.len() + over.len());
    for item in base.into_iter().chain(over) {
        let id = item.get(key).cloned();
        match merged.iter_mut().find(|m| m.get(key) == id.as_ref()) {
            Some(existing) => *existing = item,
            None => merged.push(item),
        }
    }
    Ok(merged)
}

/// The field every item of `items` (all tables) has, by which they merge; `None` when they
/// are not all tables or share no such field.
fn keyed_field(items: &[&Value]) -> Result<Option<&'static str>, String> {
    if items.is_empty() || !items.iter().all(|item| item.is_object()) {
        return Ok(None);
    }
    for field in KEYED_MERGE_FIELDS {
        if items.iter().all(|item| item.get(field).is_some()) {
            for item in items {
                match item.get(field) {
                    Some(Value::String(id)) if !id.is_empty() => {}
                    Some(Value::String(_)) => {
                        return Err(format!(
                            "the `{field}` of an item of an array must not be empty"
                        ));
                    }
                    other => {
                        return Err(format!(
                            "the `{field}` of an item of an array must be text, not `{}`",
                            other.map(Value::to_string).unwrap_or_default()
                        ));
                    }
                }
            }
            return Ok(Some(field));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_override_tables_merge_keyed_arrays_replace_and_others_append() {
        let base = json!({"agent": {
            "icon": "📋",
            "principles": ["a", "b"],
            "menu": [{"code": "PRD", "skill": "bmad-prd"}, {"code": "CE", "skill": "x"}],
            "nested": {"keep": 1, "change": 1},
        }});
        let team = json!({"agent": {
            "icon": "🏥",
            "principles": ["c"],
            "menu": [{"code": "CE", "prompt": "Do it"}, {"code": "RC", "skill": "y"}],
            "nested": {"change": 2},
        }});
        let merged = merge(base, team).expect("merges");
        assert_eq!(
            merged,
            json!({"agent": {
                "icon": "🏥",
                "principles": ["a", "b", "c"],
                "menu": [
                    {"code": "PRD", "skill": "bmad-prd"},
                    {"code": "CE", "prompt": "Do it"},
                    {"code": "RC", "skill": "y"}
                ],
                "nested": {"keep": 1, "change": 2},
            }})
        );
    }

    #[test]
    fn arrays_of_tables_without_one_common_key_append() {
        let mixed = merge(
            json!([{"code": "A"}, {"id": "b"}]),
            json!([{"code": "A", "x": 1}]),
        )
        .expect("merges");
        assert_eq!(mixed.as_array().map(Vec::len), Some(3));
        let by_id = merge(json!([{"id": "a", "v": 1}]), json!([{"id": "a", "v": 2}])).expect("ok");
        assert_eq!(by_id, json!([{"id": "a", "v": 2}]));
    }

    #[test]
    fn a_bad_merge_key_says_where() {
        let err = merge(
            json!({"agent": {"menu": [{"code": "A"}]}}),
            json!({"agent": {"menu": [{"code": 1}]}}),
        )
        .expect_err("refused");
        assert_eq!(
            err,
            "in `agent`: in `menu`: the `code` of an item of an array must be text, not `1`"
        );
        let err = merge(json!([{"code": ""}]), json!([])).expect_err("refused");
        assert!(err.contains("must not be empty"), "{err}");
    }
}
