//! YAML files of a bundle (`config.yaml`, `workflow.yaml`): a top-level mapping whose keys
//! keep their file order, values converted to JSON for the model and the variables.

use std::path::Path;

use serde_json::Value;

use super::error::BundleError;

/// The top-level `key: value` pairs of a YAML document, in file order.
pub(crate) type Entries = Vec<(String, Value)>;

/// Parses `text` (the file at `path`) as a YAML mapping.
pub(crate) fn parse_mapping(path: &Path, text: &str) -> Result<Entries, BundleError> {
    let malformed = |line: usize, problem: String| BundleError::Malformed {
        path: path.to_owned(),
        line,
        problem,
    };
    let document: yaml_serde::Value = crate::document::from_yaml(text).map_err(|e| {
        let problem = if e.limit {
            e.message
        } else {
            format!("This is not valid YAML: {}", e.message)
        };
        malformed(e.line, problem)
    })?;
    let mapping = match document {
        yaml_serde::Value::Null => return Ok(Vec::new()),
        yaml_serde::Value::Mapping(mapping) => mapping,
        _ => {
            return Err(malformed(
                1,
                "The file must be a mapping of `key: value` lines".to_owned(),
            ));
        }
    };
    let mut entries = Vec::with_capacity(mapping.len());
    for (key, value) in mapping {
        let key = match key {
            yaml_serde::Value::String(key) => key,
            other => {
                let shown = yaml_serde::to_string(&other).unwrap_or_default();
                return Err(malformed(
                    line_of_key(text, shown.trim()),
                    format!("The key `{}` is not text", shown.trim()),
                ));
            }
        };
        let value = serde_json::to_value(&value).map_err(|e| {
            malformed(
                line_of_key(text, &key),
                format!("The value of `{key}` cannot be used: {e}"),
            )
        })?;
        entries.push((key, value));
    }
    Ok(entries)
}

/// The text of a scalar (string, number, bool); `None` for null, lists and mappings.
pub(crate) fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The line (from 1) where top-level `key:` is written, for error messages (1 when it is
/// not found).
pub(crate) fn line_of_key(text: &str, key: &str) -> usize {
    text.lines()
        .position(|line| {
            line.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map_or(1, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_keep_their_order_and_values_become_json() {
        let text = "b: 1\na: '{project-root}/docs'\nlist:\n  - x: y\nempty:\n";
        let entries = parse_mapping(Path::new("c.yaml"), text).expect("succeeds");
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "list", "empty"]);
        assert_eq!(entries[1].1, json!("{project-root}/docs"));
        assert_eq!(entries[2].1, json!([{"x": "y"}]));
        assert_eq!(scalar_text(&entries[0].1).as_deref(), Some("1"));
        assert_eq!(scalar_text(&entries[3].1), None);
    }

    #[test]
    fn malformed_yaml_names_file_and_line() {
        let err =
            parse_mapping(Path::new("w.yaml"), "a: 1\nb: [unclosed\nc: 3\n").expect_err("fails");
        let BundleError::Malformed { line, problem, .. } = &err else {
            panic!("{err:?}");
        };
        assert!(*line >= 2, "{err}");
        assert!(problem.starts_with("This is not valid YAML"), "{err}");
        assert!(err.to_string().starts_with("`w.yaml` line "), "{err}");
        let err = parse_mapping(Path::new("w.yaml"), "- a\n- b\n").expect_err("fails");
        assert_eq!(
            err.to_string(),
            "`w.yaml` line 1: The file must be a mapping of `key: value` lines"
        );
    }
}
