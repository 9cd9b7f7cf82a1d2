//! Path variables: `{project-root}`, config values, workflow keys, `{date}` and `{{date}}`.
//!
//! Values are stored as written and resolved when used, so a value may refer to other
//! variables (`output_folder: "{project-root}/docs"`, `status_file:
//! "{implementation_artifacts}/status.yaml"`), to any depth, with cycles reported.
//!
//! A variable is `{name}` where `name` is a letter or `_` followed by letters, digits, `_` or
//! `-`; anything else in braces (`{ date }`, `{}`) is plain text. `{{name}}` is a template
//! value the model fills in while it works; only `{{date}}` is resolved here, the rest are
//! kept. [`Variables::resolve`] is strict (an unknown `{name}` is an error listing the
//! names available); [`Variables::resolve_lenient`] keeps unknown names as they are, for
//! prose such as instructions.

use std::collections::BTreeMap;

use super::error::VariableError;
pub(crate) use crate::date::today;

/// How deep values may refer to other values before it counts as a cycle.
const MAX_DEPTH: usize = 32;

/// Named values for `{name}` references.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Variables {
    values: BTreeMap<String, String>,
}

/// One piece of a text with variables.
enum Piece<'t> {
    Text(&'t str),
    /// `{name}`.
    Variable(&'t str),
    /// `{{name}}` (the inner text, trimmed).
    Template(&'t str, &'t str),
}

impl Variables {
    /// No variables.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Defines `name` as `value` (as written: it may refer to other variables).
    pub(crate) fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.values.insert(name.into(), value.into());
    }

    /// Every defined name, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        self.values.keys().cloned().collect()
    }

    /// The value of `name` with every variable in it resolved; `None` when undefined.
    pub fn value(&self, name: &str) -> Option<Result<String, VariableError>> {
        let raw = self.values.get(name)?;
        let mut stack = vec![name.to_owned()];
        Some(self.expand(raw, true, &mut stack))
    }

    /// `text` with every `{name}` and `{{date}}` resolved; an unknown `{name}` is an error.
    pub(crate) fn resolve(&self, text: &str) -> Result<String, VariableError> {
        self.expand(text, true, &mut Vec::new())
    }

    /// `text` with the variables it can resolve resolved; the rest stay as written.
    pub(crate) fn resolve_lenient(&self, text: &str) -> String {
        self.expand(text, false, &mut Vec::new())
            .unwrap_or_else(|_| text.to_owned())
    }

    fn expand(
        &self,
        text: &str,
        strict: bool,
        stack: &mut Vec<String>,
    ) -> Result<String, VariableError> {
        let mut out = String::with_capacity(text.len());
        for piece in pieces(text) {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Template(name, written) => match self.values.get(name) {
                    Some(_) if name == "date" => {
                        out.push_str(&self.expand_name(name, text, strict, stack)?)
                    }
                    _ => out.push_str(written),
                },
                Piece::Variable(name) => {
                    out.push_str(&self.expand_name(name, text, strict, stack)?)
                }
            }
        }
        Ok(out)
    }

    fn expand_name(
        &self,
        name: &str,
        text: &str,
        strict: bool,
        stack: &mut Vec<String>,
    ) -> Result<String, VariableError> {
        let Some(raw) = self.values.get(name) else {
            if strict {
                return Err(VariableError::Unknown {
                    name: name.to_owned(),
                    text: text.to_owned(),
                    available: self.names(),
                });
            }
            return Ok(format!("{{{name}}}"));
        };
        if stack.iter().any(|n| n == name) || stack.len() >= MAX_DEPTH {
            let mut chain: Vec<String> = stack.iter().map(|n| format!("`{{{n}}}`")).collect();
            chain.push(format!("`{{{name}}}`"));
            if !strict {
                return Ok(format!("{{{name}}}"));
            }
            return Err(VariableError::Cycle {
                name: name.to_owned(),
                chain: chain.join(" → "),
            });
        }
        stack.push(name.to_owned());
        let value = self.expand(raw, strict, stack);
        stack.pop();
        value
    }
}

/// The `{{name}}` template values left in `text`, in order.
pub(crate) fn template_values(text: &str) -> Vec<String> {
    pieces(text)
        .filter_map(|p| match p {
            Piece::Template(name, _) => Some(name.to_owned()),
            _ => None,
        })
        .collect()
}

/// The `{name}` variables referred to in `text`, in order.
pub(crate) fn variable_names(text: &str) -> Vec<String> {
    pieces(text)
        .filter_map(|p| match p {
            Piece::Variable(name) => Some(name.to_owned()),
            _ => None,
        })
        .collect()
}

/// Splits `text` into plain text, `{name}` and `{{name}}`.
fn pieces(text: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut search = 0;
        while let Some(offset) = rest[search..].find('{') {
            let at = search + offset;
            if at > 0 {
                // Plain text up to the brace comes out first.
                let (before, after) = rest.split_at(at);
                if parse_reference(after).is_some() {
                    rest = after;
                    return Some(Piece::Text(before));
                }
            } else if let Some((piece, len)) = parse_reference(rest) {
                rest = &rest[len..];
                return Some(piece);
            }
            search = at + 1;
        }
        let all = rest;
        rest = "";
        Some(Piece::Text(all))
    })
}

/// A `{name}` or `{{name}}` at the start of `text`, with its length.
fn parse_reference(text: &str) -> Option<(Piece<'_>, usize)> {
    if let Some(inner) = text.strip_prefix("{{") {
        let end = inner.find("}}")?;
        let name = inner[..end].trim();
        if is_name(name) {
            return Some((Piece::Template(name, &text[..end + 4]), end + 4));
        }
        return None;
    }
    let inner = text.strip_prefix('{')?;
    let end = inner.find('}')?;
    let name = &inner[..end];
    is_name(name).then_some((Piece::Variable(name), end + 2))
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Variables {
        let mut v = Variables::new();
        for (k, val) in pairs {
            v.set(*k, *val);
        }
        v
    }

    #[test]
    fn nested_values_resolve_to_any_depth() {
        let v = vars(&[
            ("project-root", "/p"),
            ("output_folder", "{project-root}/docs"),
            ("status_file", "{output_folder}/status.yaml"),
            ("default_output_file", "{status_file}"),
        ]);
        assert_eq!(
            v.resolve("{default_output_file}"),
            Ok("/p/docs/status.yaml".to_owned())
        );
        assert_eq!(v.value("output_folder"), Some(Ok("/p/docs".to_owned())));
    }

    #[test]
    fn date_resolves_in_single_and_double_braces_and_other_template_values_stay() {
        let v = vars(&[("date", "2026-11-26"), ("output_folder", "/o")]);
        assert_eq!(
            v.resolve("{output_folder}/dt-{{date}}-{date}-{{ story_key }}.md"),
            Ok("/o/dt-2026-11-26-2026-11-26-{{ story_key }}.md".to_owned())
        );
        assert_eq!(
            template_values("a {{story_key}} b {{ x }}"),
            ["story_key", "x"]
        );
    }

    #[test]
    fn an_unknown_variable_is_an_error_listing_the_available_ones() {
        let v = vars(&[("project-root", "/p"), ("user_name", "Jane")]);
        let err = v.resolve("{project-root}/{secret}/x").expect_err("fails");
        assert_eq!(
            err.to_string(),
            "Unknown variable `{secret}` in `{project-root}/{secret}/x`; the variables \
             available are: `{project-root}`, `{user_name}`"
        );
        assert_eq!(
            v.resolve_lenient("hi {user_name}, {data} and { date }"),
            "hi Jane, {data} and { date }"
        );
    }

    #[test]
    fn braces_that_are_not_names_are_text() {
        let v = vars(&[("a", "1")]);
        assert_eq!(
            v.resolve("{ a } {} {a b} {{}} {a}{"),
            Ok("{ a } {} {a b} {{}} 1{".to_owned())
        );
        assert_eq!(variable_names("x {a} {b-c} {{d}} { e }"), ["a", "b-c"]);
    }

    #[test]
    fn a_cycle_is_reported_not_followed_forever() {
        let v = vars(&[("a", "{b}/x"), ("b", "{a}/y")]);
        let err = v.resolve("{a}").expect_err("fails");
        assert_eq!(
            err.to_string(),
            "Variable `{a}` refers to itself (through `{a}` → `{b}` → `{a}`)"
        );
        assert_eq!(v.resolve_lenient("{a}"), "{a}/y/x");
    }
}
