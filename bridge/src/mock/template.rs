//! Reply templates: text with `{{...}}` placeholders, parsed once at script load.

use std::borrow::Cow;

use regex::{Captures, Regex};

use super::prompt::Prompt;

/// A parsed template. Placeholders that name nothing known stay verbatim, so code such as
/// Python's `f"{{x}}"` survives unless `x` is a capture group of the rule.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    /// Numbered group of the rule's first regex (`last_user`, else `last_tool`, else `system`).
    Group(usize),
    /// Named group of any of the rule's regexes.
    Named(String),
    LastUser,
    LastTool,
    ToolName,
    System,
    Model,
    Turn,
}

/// The regexes whose capture groups a template may refer to, in precedence order:
/// `last_user`, `last_tool`, `system` (numbered groups refer to the first one present).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Groups<'r> {
    pub(crate) regexes: [Option<&'r Regex>; 3],
}

/// Captures of a matched rule, borrowed from the request, in the order of [`Groups`].
#[derive(Debug, Default)]
pub(crate) struct Matched<'h> {
    pub(crate) captures: [Option<Captures<'h>>; 3],
}

impl Template {
    /// Parses `text`, resolving placeholders against `groups`.
    pub(crate) fn parse(text: &str, groups: Groups<'_>) -> Self {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else { break };
            let name = after[..end].trim();
            literal.push_str(&rest[..start]);
            match resolve(name, groups) {
                Some(part) => {
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(part);
                }
                None => literal.push_str(&rest[start..start + 2 + end + 2]),
            }
            rest = &after[end + 2..];
        }
        literal.push_str(rest);
        if !literal.is_empty() || parts.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Self { parts }
    }

    /// Whether the template is plain text, without placeholders.
    pub(crate) fn is_literal(&self) -> bool {
        matches!(self.parts.as_slice(), [Part::Literal(_)])
    }

    /// Whether rendering needs the rule's capture groups.
    pub(crate) fn uses_captures(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Group(_) | Part::Named(_)))
    }

    /// Renders the template for one request.
    pub(crate) fn render(&self, prompt: &Prompt<'_>, matched: &Matched<'_>) -> String {
        if let [Part::Literal(s)] = self.parts.as_slice() {
            return s.clone();
        }
        self.render_with(prompt, matched, Cow::Borrowed)
    }

    /// Renders the template, passing every substituted value (not the literal text) through
    /// `map`, e.g. `regex::escape` for a template that is a pattern.
    pub(crate) fn render_with<'v>(
        &self,
        prompt: &Prompt<'v>,
        matched: &Matched<'v>,
        map: impl Fn(&'v str) -> Cow<'v, str>,
    ) -> String {
        let mut out = String::new();
        for part in &self.parts {
            let value = match part {
                Part::Literal(s) => {
                    out.push_str(s);
                    continue;
                }
                Part::Group(i) => {
                    let caps = matched.captures.iter().flatten().next();
                    caps.and_then(|c| c.get(*i)).map(|m| m.as_str())
                }
                Part::Named(name) => matched
                    .captures
                    .iter()
                    .flatten()
                    .find_map(|c| c.name(name))
                    .map(|m| m.as_str()),
                Part::LastUser => Some(prompt.last_user),
                Part::LastTool => Some(prompt.last_tool.unwrap_or_default()),
                Part::ToolName => Some(prompt.tool_name),
                Part::System => Some(prompt.system),
                Part::Model => Some(prompt.model),
                Part::Turn => {
                    out.push_str(&prompt.turn.to_string());
                    continue;
                }
            };
            if let Some(value) = value {
                out.push_str(&map(value));
            }
        }
        out
    }
}

fn resolve(name: &str, groups: Groups<'_>) -> Option<Part> {
    match name {
        "last_user" => return Some(Part::LastUser),
        "last_tool" => return Some(Part::LastTool),
        "tool_name" => return Some(Part::ToolName),
        "system" => return Some(Part::System),
        "model" => return Some(Part::Model),
        "turn" => return Some(Part::Turn),
        _ => {}
    }
    if let Ok(i) = name.parse::<usize>() {
        let primary = groups.regexes.iter().flatten().next()?;
        return (i < primary.captures_len()).then_some(Part::Group(i));
    }
    let known = groups
        .regexes
        .iter()
        .flatten()
        .any(|re| re.capture_names().flatten().any(|n| n == name));
    known.then(|| Part::Named(name.to_owned()))
}
