//! Instruction templates: `{key}` and `{key?}` filled from the session state.
//!
//! `{key}` is replaced by the value of state key `key` (a string as it is, anything else as
//! JSON); a missing key is an error that names it. `{key?}` is replaced by the empty string
//! when the key is missing. A key is an identifier (letters, digits, `_`), optionally with a
//! scope prefix (`temp:`, `user:`, `app:`); a scoped key may be namespaced further
//! (`temp:discovery:query`). Braces around anything else (a JSON example, a code snippet)
//! are left as they are.

use serde_json::Value;

use crate::state::State;

/// A template named a state key the state does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "The instruction needs state key `{key}`, which is not set; set it before this agent runs, \
     or write `{{{key}?}}` to allow it to be missing"
)]
pub struct MissingKey {
    /// The key.
    pub(crate) key: String,
}

/// `template` with every `{key}` and `{key?}` replaced from `state`.
pub fn render_template(template: &str, state: &State) -> Result<String, MissingKey> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return Ok(out);
        };
        let inner = &after[..close];
        let (key, optional) = match inner.strip_suffix('?') {
            Some(key) => (key, true),
            None => (inner, false),
        };
        if is_key(key) {
            match state.get(key) {
                Some(Value::String(text)) => out.push_str(text),
                Some(value) => out.push_str(&value.to_string()),
                None if optional => {}
                None => {
                    return Err(MissingKey {
                        key: key.to_owned(),
                    });
                }
            }
            rest = &after[close + 1..];
        } else {
            // Not a placeholder: keep the brace and look again just after it.
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether `text` is a state key a template may name: an identifier, or a scoped key
/// (`temp:`, `user:`, `app:`) of identifiers joined by `:`.
pub(crate) fn is_key(text: &str) -> bool {
    match ["temp:", "user:", "app:"]
        .iter()
        .find_map(|p| text.strip_prefix(p))
    {
        // Only a scoped key may have namespaces, so `{a:b}` in prose stays text.
        Some(name) => name.split(':').all(is_identifier),
        None => is_identifier(text),
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state() -> State {
        let mut state = State::default();
        state.set("topic", json!("sales"));
        state.set("temp:round", json!(2));
        state.set("temp:discovery:query", json!("Which region?"));
        state.set("user:prefs", json!({"tone": "brief"}));
        state
    }

    #[test]
    fn keys_are_filled_and_optional_ones_may_be_missing() {
        let out = render_template(
            "On {topic}, round {temp:round}; prefs {user:prefs}; feedback: {refinement_feedback?}.",
            &state(),
        );
        assert_eq!(
            out.as_deref(),
            Ok(r#"On sales, round 2; prefs {"tone":"brief"}; feedback: ."#)
        );
    }

    #[test]
    fn scoped_keys_may_be_namespaced_and_unscoped_ones_not() {
        let out = render_template(
            "Asked: {temp:discovery:query}; found: {temp:discovery:results?}; {a:b} {temp:x:}",
            &state(),
        );
        assert_eq!(
            out.as_deref(),
            Ok("Asked: Which region?; found: ; {a:b} {temp:x:}")
        );
    }

    #[test]
    fn a_missing_key_is_named() {
        let err = render_template("Fix {draft}.", &state()).expect_err("missing");
        assert_eq!(err.key, "draft");
        assert!(err.to_string().contains("`{draft?}`"), "{err}");
    }

    #[test]
    fn braces_that_are_not_placeholders_stay() {
        let text = r#"Answer as {"answer": "..."} or { } or {not a key} or {topic"#;
        assert_eq!(render_template(text, &state()).as_deref(), Ok(text));
        assert_eq!(
            render_template("{{topic}}", &state()).as_deref(),
            Ok("{sales}")
        );
    }
}
