//! Scripts: how each mock model replies. Parsed and compiled (regexes, templates) once at load.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use super::error::MockError;
use super::latency::Latency;
use super::prompt::Prompt;
use super::template::{Groups, Matched, Template};

/// A compiled script; cheap to clone. `Default` echoes the last user message for every model.
#[derive(Debug, Clone, Default)]
pub struct Script {
    inner: Arc<Compiled>,
}

#[derive(Debug, Default)]
struct Compiled {
    models: HashMap<String, ModelScript>,
    default: Option<ModelScript>,
    names: Vec<String>,
}

#[derive(Debug)]
struct ModelScript {
    rules: Vec<Rule>,
    replies: Vec<Reply>,
    fallback: Option<Reply>,
    latency: Option<Latency>,
    context_window: Option<u64>,
}

#[derive(Debug)]
struct Rule {
    last_user: Option<Regex>,
    last_tool: Option<Regex>,
    system: Option<Regex>,
    tool_name: Option<Regex>,
    model: Option<Regex>,
    turn: Option<u64>,
    needs_captures: bool,
    reply: Reply,
}

#[derive(Debug)]
struct Reply {
    content: Option<Behaviour>,
    tool_calls: Vec<ToolCallTemplate>,
    finish_reason: Option<String>,
}

/// A scripted tool call whose string arguments are templates.
#[derive(Debug)]
struct ToolCallTemplate {
    name: String,
    arguments: JsonTemplate,
}

/// A JSON value whose strings may hold `{{...}}` placeholders.
#[derive(Debug)]
enum JsonTemplate {
    /// No placeholder anywhere below.
    Literal(Value),
    Text(Template),
    Array(Vec<JsonTemplate>),
    Object(Vec<(String, JsonTemplate)>),
}

impl JsonTemplate {
    fn parse(value: Value, groups: Groups<'_>) -> Self {
        let tree = match value {
            Value::String(text) => {
                let template = Template::parse(&text, groups);
                if template.is_literal() {
                    return Self::Literal(Value::String(text));
                }
                Self::Text(template)
            }
            Value::Array(items) => {
                Self::Array(items.into_iter().map(|v| Self::parse(v, groups)).collect())
            }
            Value::Object(fields) => Self::Object(
                fields
                    .into_iter()
                    .map(|(k, v)| (k, Self::parse(v, groups)))
                    .collect(),
            ),
            other => return Self::Literal(other),
        };
        match tree.literal() {
            Some(value) => Self::Literal(value),
            None => tree,
        }
    }

    /// The value, if nothing below is a template.
    fn literal(&self) -> Option<Value> {
        match self {
            Self::Literal(v) => Some(v.clone()),
            Self::Text(_) => None,
            Self::Array(items) => items.iter().map(Self::literal).collect::<Option<_>>(),
            Self::Object(fields) => fields
                .iter()
                .map(|(k, v)| v.literal().map(|v| (k.clone(), v)))
                .collect::<Option<serde_json::Map<_, _>>>()
                .map(Value::Object),
        }
    }

    fn render(&self, prompt: &Prompt<'_>, matched: &Matched<'_>) -> Value {
        match self {
            Self::Literal(v) => v.clone(),
            Self::Text(t) => Value::String(t.render(prompt, matched)),
            Self::Array(items) => items.iter().map(|v| v.render(prompt, matched)).collect(),
            Self::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.render(prompt, matched)))
                    .collect(),
            ),
        }
    }

    fn uses_captures(&self) -> bool {
        match self {
            Self::Literal(_) => false,
            Self::Text(t) => t.uses_captures(),
            Self::Array(items) => items.iter().any(Self::uses_captures),
            Self::Object(fields) => fields.iter().any(|(_, v)| v.uses_captures()),
        }
    }
}

#[derive(Debug)]
enum Behaviour {
    Text(Template),
    Echo {
        input: Template,
    },
    CountWord {
        word: Template,
        input: Template,
        whole_word: bool,
    },
    Label {
        table: Vec<(String, String)>,
        default: Template,
        input: Template,
        case_insensitive: bool,
        per_line: bool,
    },
    Extract {
        pattern: Template,
        default: Template,
        input: Template,
    },
}

/// A tool call a script makes the model emit.
#[derive(Debug, Clone)]
pub(crate) struct ScriptedToolCall {
    pub(crate) name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub(crate) arguments_json: String,
    /// The arguments as a value (Anthropic's `input`).
    pub(crate) arguments: Value,
}

/// The scripted answer to one request.
#[derive(Debug)]
pub(crate) struct ScriptedReply<'s> {
    pub(crate) text: String,
    pub(crate) tool_calls: Vec<ScriptedToolCall>,
    pub(crate) finish_reason: Option<&'s str>,
}

impl Script {
    /// Parses and compiles a JSON script.
    pub fn from_json_str(s: &str) -> Result<Self, MockError> {
        Self::parse(s, "<string>")
    }

    /// Reads, parses and compiles a JSON script file.
    pub fn from_path(path: &Path) -> Result<Self, MockError> {
        let text = std::fs::read_to_string(path).map_err(|error| MockError::ReadScript {
            path: path.to_owned(),
            error,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Compiles a script given as a JSON value (handy with `serde_json::json!` in tests).
    pub fn from_json_value(value: Value) -> Result<Self, MockError> {
        let spec: ScriptSpec = serde_json::from_value(value).map_err(|e| invalid("<value>", e))?;
        Self::compile(spec, "<value>")
    }

    /// The model names the script defines (without `*`), sorted.
    pub fn model_names(&self) -> &[String] {
        &self.inner.names
    }

    fn parse(text: &str, origin: &str) -> Result<Self, MockError> {
        let spec: ScriptSpec = serde_json::from_str(text).map_err(|e| invalid(origin, e))?;
        Self::compile(spec, origin)
    }

    fn compile(spec: ScriptSpec, origin: &str) -> Result<Self, MockError> {
        let mut compiled = Compiled::default();
        for (name, model) in spec.models {
            let path = format!("models.{name:?}");
            let script =
                compile_model(model, &path).map_err(|message| MockError::InvalidScript {
                    origin: origin.to_owned(),
                    message,
                })?;
            if name == "*" {
                compiled.default = Some(script);
            } else {
                compiled.names.push(name.clone());
                compiled.models.insert(name, script);
            }
        }
        Ok(Self {
            inner: Arc::new(compiled),
        })
    }

    fn model_script(&self, model: &str) -> Option<&ModelScript> {
        self.inner.models.get(model).or(self.inner.default.as_ref())
    }

    /// Per-model latency override, if the script sets one.
    pub(crate) fn latency_for(&self, model: &str) -> Option<&Latency> {
        self.model_script(model).and_then(|m| m.latency.as_ref())
    }

    /// The context window `GET /v1/models` lists for `model` (as vLLM's `max_model_len`), if
    /// the script sets one.
    pub(crate) fn context_window_for(&self, model: &str) -> Option<u64> {
        self.inner.models.get(model).and_then(|m| m.context_window)
    }

    /// Chooses and renders the reply: rules (first match) → `replies[turn]` → `fallback` →
    /// last reply → echo.
    pub(crate) fn reply(&self, prompt: &Prompt<'_>) -> ScriptedReply<'_> {
        let Some(model) = self.model_script(prompt.model) else {
            return ScriptedReply {
                text: prompt.last_user.to_owned(),
                tool_calls: Vec::new(),
                finish_reason: None,
            };
        };
        for rule in &model.rules {
            if let Some(matched) = rule.matches(prompt) {
                return rule.reply.render(prompt, &matched);
            }
        }
        let idx = usize::try_from(prompt.turn).unwrap_or(usize::MAX);
        let chosen = model
            .replies
            .get(idx)
            .or(model.fallback.as_ref())
            .or(model.replies.last());
        match chosen {
            Some(reply) => reply.render(prompt, &Matched::default()),
            None => ScriptedReply {
                text: prompt.last_user.to_owned(),
                tool_calls: Vec::new(),
                finish_reason: None,
            },
        }
    }
}

impl Rule {
    fn matches<'h>(&self, prompt: &Prompt<'h>) -> Option<Matched<'h>> {
        if self.turn.is_some_and(|t| t != prompt.turn) {
            return None;
        }
        if self
            .model
            .as_ref()
            .is_some_and(|re| !re.is_match(prompt.model))
        {
            return None;
        }
        if let Some(re) = &self.tool_name
            && (prompt.last_tool.is_none() || !re.is_match(prompt.tool_name))
        {
            return None;
        }
        if self.last_tool.is_some() && prompt.last_tool.is_none() {
            return None;
        }
        let mut matched = Matched::default();
        let conditions = [
            (&self.last_user, prompt.last_user),
            (&self.last_tool, prompt.last_tool.unwrap_or_default()),
            (&self.system, prompt.system),
        ];
        for (slot, (re, haystack)) in matched.captures.iter_mut().zip(conditions) {
            let Some(re) = re else { continue };
            if self.needs_captures {
                *slot = Some(re.captures(haystack)?);
            } else if !re.is_match(haystack) {
                return None;
            }
        }
        Some(matched)
    }
}

impl Reply {
    fn render<'s>(&'s self, prompt: &Prompt<'_>, matched: &Matched<'_>) -> ScriptedReply<'s> {
        let text = match &self.content {
            None => String::new(),
            Some(Behaviour::Text(t)) => t.render(prompt, matched),
            Some(Behaviour::Echo { input }) => input.render(prompt, matched),
            Some(Behaviour::CountWord {
                word,
                input,
                whole_word,
            }) => {
                let word = word.render(prompt, matched);
                let input = input.render(prompt, matched);
                count_word(&input, &word, *whole_word).to_string()
            }
            Some(Behaviour::Label {
                table,
                default,
                input,
                case_insensitive,
                per_line,
            }) => {
                let input = input.render(prompt, matched);
                let default = default.render(prompt, matched);
                let label_of = |text: &str| {
                    let found = if *case_insensitive {
                        let lower = text.to_lowercase();
                        table.iter().find(|(kw, _)| lower.contains(kw.as_str()))
                    } else {
                        table.iter().find(|(kw, _)| text.contains(kw.as_str()))
                    };
                    found.map_or(default.as_str(), |(_, label)| label.as_str())
                };
                if *per_line {
                    let labels: Vec<&str> = input
                        .lines()
                        .filter(|line| !line.trim().is_empty())
                        .map(label_of)
                        .collect();
                    labels.join("\n")
                } else {
                    label_of(&input).to_owned()
                }
            }
            Some(Behaviour::Extract {
                pattern,
                default,
                input,
            }) => {
                let input = input.render(prompt, matched);
                // Captured text is escaped, so the pattern is as valid as it was at load.
                let pattern = pattern.render_with(prompt, matched, |s| regex::escape(s).into());
                let found = Regex::new(&pattern).ok().and_then(|re| {
                    let caps = re.captures(&input)?;
                    let m = caps.get(1).or_else(|| caps.get(0))?;
                    Some(m.as_str().to_owned())
                });
                found.unwrap_or_else(|| default.render(prompt, matched))
            }
        };
        let tool_calls = self
            .tool_calls
            .iter()
            .map(|call| {
                let arguments = call.arguments.render(prompt, matched);
                ScriptedToolCall {
                    name: call.name.clone(),
                    arguments_json: arguments.to_string(),
                    arguments,
                }
            })
            .collect();
        ScriptedReply {
            text,
            tool_calls,
            finish_reason: self.finish_reason.as_deref(),
        }
    }

    fn uses_captures(&self) -> bool {
        if self.tool_calls.iter().any(|c| c.arguments.uses_captures()) {
            return true;
        }
        match &self.content {
            None => false,
            Some(Behaviour::Text(t)) | Some(Behaviour::Echo { input: t }) => t.uses_captures(),
            Some(Behaviour::CountWord { word, input, .. }) => {
                word.uses_captures() || input.uses_captures()
            }
            Some(Behaviour::Label { default, input, .. }) => {
                default.uses_captures() || input.uses_captures()
            }
            Some(Behaviour::Extract {
                pattern,
                default,
                input,
            }) => pattern.uses_captures() || default.uses_captures() || input.uses_captures(),
        }
    }
}

/// Non-overlapping, case-sensitive occurrences of `word` in `text`. With `whole_word`, only
/// occurrences not preceded or followed by an alphanumeric character or `_` count.
pub(crate) fn count_word(text: &str, word: &str, whole_word: bool) -> usize {
    if word.is_empty() {
        return 0;
    }
    if !whole_word {
        return text.matches(word).count();
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word)
        .filter(|(at, _)| {
            let before = text[..*at].chars().next_back();
            let after = text[at + word.len()..].chars().next();
            !before.is_some_and(is_word) && !after.is_some_and(is_word)
        })
        .count()
}

fn invalid(origin: &str, e: serde_json::Error) -> MockError {
    MockError::InvalidScript {
        origin: origin.to_owned(),
        message: e.to_string(),
    }
}

// ---- the JSON shape -------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptSpec {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    models: BTreeMap<String, ModelSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSpec {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    rules: Vec<RuleSpec>,
    #[serde(default)]
    replies: Vec<Value>,
    #[serde(default)]
    fallback: Option<Value>,
    #[serde(default)]
    latency: Option<Latency>,
    #[serde(default)]
    context_window: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    last_user: Option<String>,
    #[serde(default)]
    last_tool: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    turn: Option<u64>,
    reply: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplySpec {
    #[serde(default)]
    text: Option<String>,
    #[serde(default, alias = "behavior")]
    behaviour: Option<BehaviourName>,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    word: Option<String>,
    #[serde(default)]
    whole_word: bool,
    #[serde(default)]
    table: Option<Vec<LabelEntry>>,
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    per_line: bool,
    #[serde(default)]
    pattern: Option<String>,
    #[serde(default)]
    tool_call: Option<ToolCallSpec>,
    #[serde(default)]
    tool_calls: Vec<ToolCallSpec>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BehaviourName {
    Echo,
    Fixed,
    CountWord,
    Label,
    Extract,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LabelEntry {
    Pair(String, String),
    Object { keyword: String, label: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallSpec {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

fn compile_model(spec: ModelSpec, path: &str) -> Result<ModelScript, String> {
    if let Some(l) = &spec.latency {
        l.validate().map_err(|e| format!("{path}.latency: {e}"))?;
    }
    let mut rules = Vec::with_capacity(spec.rules.len());
    for (i, rule) in spec.rules.into_iter().enumerate() {
        rules.push(compile_rule(rule, &format!("{path}.rules[{i}]"))?);
    }
    let replies = spec
        .replies
        .into_iter()
        .enumerate()
        .map(|(i, v)| compile_reply(v, &format!("{path}.replies[{i}]"), Groups::default()))
        .collect::<Result<Vec<_>, _>>()?;
    let fallback = spec
        .fallback
        .map(|v| compile_reply(v, &format!("{path}.fallback"), Groups::default()))
        .transpose()?;
    Ok(ModelScript {
        rules,
        replies,
        fallback,
        latency: spec.latency,
        context_window: spec.context_window,
    })
}

fn compile_rule(spec: RuleSpec, path: &str) -> Result<Rule, String> {
    let regex = |field: &str, pattern: Option<String>| -> Result<Option<Regex>, String> {
        pattern
            .map(|p| Regex::new(&p).map_err(|e| format!("{path}.{field}: invalid regex: {e}")))
            .transpose()
    };
    let last_user = regex("last_user", spec.last_user)?;
    let last_tool = regex("last_tool", spec.last_tool)?;
    let system = regex("system", spec.system)?;
    let tool_name = regex("tool_name", spec.tool_name)?;
    let model = regex("model", spec.model)?;
    let groups = Groups {
        regexes: [last_user.as_ref(), last_tool.as_ref(), system.as_ref()],
    };
    let reply = compile_reply(spec.reply, &format!("{path}.reply"), groups)?;
    let needs_captures = reply.uses_captures();
    Ok(Rule {
        last_user,
        last_tool,
        system,
        tool_name,
        model,
        turn: spec.turn,
        needs_captures,
        reply,
    })
}

fn compile_reply(value: Value, path: &str, groups: Groups<'_>) -> Result<Reply, String> {
    let spec: ReplySpec = match value {
        Value::String(text) => {
            return Ok(Reply {
                content: Some(Behaviour::Text(Template::parse(&text, groups))),
                tool_calls: Vec::new(),
                finish_reason: None,
            });
        }
        Value::Object(_) => serde_json::from_value(value).map_err(|e| format!("{path}: {e}"))?,
        other => {
            return Err(format!(
                "{path}: a reply is a string or an object, found `{}`",
                short(&other.to_string())
            ));
        }
    };
    let tmpl = |s: &str| Template::parse(s, groups);
    let input = tmpl(spec.input.as_deref().unwrap_or("{{last_user}}"));
    let content = match (spec.behaviour, spec.text) {
        (None, None) => None,
        (None | Some(BehaviourName::Fixed), Some(text)) => Some(Behaviour::Text(tmpl(&text))),
        (Some(BehaviourName::Fixed), None) => {
            return Err(format!("{path}: behaviour `fixed` needs `text`"));
        }
        (Some(b), Some(_)) => {
            return Err(format!(
                "{path}: `text` only goes with behaviour `fixed`, not `{b:?}`"
            ));
        }
        (Some(BehaviourName::Echo), None) => Some(Behaviour::Echo { input }),
        (Some(BehaviourName::CountWord), None) => {
            let word = spec
                .word
                .ok_or_else(|| format!("{path}: behaviour `count_word` needs `word`"))?;
            Some(Behaviour::CountWord {
                word: tmpl(&word),
                input,
                whole_word: spec.whole_word,
            })
        }
        (Some(BehaviourName::Label), None) => {
            let table = spec
                .table
                .ok_or_else(|| format!("{path}: behaviour `label` needs `table`"))?
                .into_iter()
                .map(|e| {
                    let (kw, label) = match e {
                        LabelEntry::Pair(k, l)
                        | LabelEntry::Object {
                            keyword: k,
                            label: l,
                        } => (k, l),
                    };
                    let kw = if spec.case_insensitive {
                        kw.to_lowercase()
                    } else {
                        kw
                    };
                    (kw, label)
                })
                .collect();
            Some(Behaviour::Label {
                table,
                default: tmpl(spec.default.as_deref().unwrap_or("unknown")),
                input,
                case_insensitive: spec.case_insensitive,
                per_line: spec.per_line,
            })
        }
        (Some(BehaviourName::Extract), None) => {
            let source = spec
                .pattern
                .ok_or_else(|| format!("{path}: behaviour `extract` needs `pattern`"))?;
            let pattern = tmpl(&source);
            // Placeholders render as escaped text, so checking the literal parts (with the
            // placeholders empty) checks every rendering.
            let empty = Prompt {
                model: "",
                system: "",
                last_user: "",
                last_tool: None,
                tool_name: "",
                turn: 0,
            };
            let probe = pattern.render_with(&empty, &Matched::default(), |_| "".into());
            Regex::new(&probe)
                .map_err(|e| format!("{path}.pattern: invalid regex `{source}`: {e}"))?;
            Some(Behaviour::Extract {
                pattern,
                default: tmpl(spec.default.as_deref().unwrap_or("")),
                input,
            })
        }
    };
    let mut calls = spec.tool_calls;
    if let Some(call) = spec.tool_call {
        calls.insert(0, call);
    }
    let tool_calls = calls
        .into_iter()
        .map(|c| ToolCallTemplate {
            name: c.name,
            arguments: JsonTemplate::parse(
                c.arguments
                    .unwrap_or_else(|| Value::Object(Default::default())),
                groups,
            ),
        })
        .collect::<Vec<_>>();
    if content.is_none() && tool_calls.is_empty() {
        return Err(format!(
            "{path}: a reply needs `text`, `behaviour` or `tool_call`"
        ));
    }
    Ok(Reply {
        content,
        tool_calls,
        finish_reason: spec.finish_reason,
    })
}

fn short(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
