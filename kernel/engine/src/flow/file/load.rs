//! Reading workflow files: YAML to [`AgentSpec`] trees, with errors that point at the text.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::spec::{AgentClass, AgentConfig, END, SuccessorConfig};
use crate::condition::Condition;

/// Where workflow files are read from: the file system, or files embedded in a binary.
pub trait FileSource: Send + Sync {
    /// The text of the file at `path`.
    fn read(&self, path: &Path) -> std::io::Result<String>;
}

/// The file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filesystem;

impl FileSource for Filesystem {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        crate::document::read_to_string(path)
    }
}

/// Files held in memory by path (the built-in workflows).
#[derive(Debug, Clone, Default)]
pub struct EmbeddedFiles {
    files: BTreeMap<PathBuf, String>,
}

impl EmbeddedFiles {
    /// No files.
    pub fn new() -> Self {
        Self::default()
    }

    /// These files plus `text` at `path`.
    pub fn with(mut self, path: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        self.files.insert(normalize(&path.into()), text.into());
        self
    }
}

impl FileSource for EmbeddedFiles {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        self.files.get(&normalize(path)).cloned().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such embedded file")
        })
    }
}

/// `path` with `.` dropped and `..` applied, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with a workflow file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// A file could not be read.
    Read,
    /// The text is not YAML, or not the shape a workflow file has (unknown or missing keys,
    /// wrong types).
    Schema,
    /// Two sibling agents share a name.
    DuplicateName,
    /// A file names itself through its sub-agents.
    Cycle,
    /// A graph names a node it does not have, or a setting does not fit its class.
    Invalid,
    /// A model, tool, callback or class that nothing provides.
    Unknown,
}

/// A workflow file error: the file, the line and column, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", .file.display())]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// The line (1-based).
    pub line: usize,
    /// The column (1-based).
    pub column: usize,
    /// What kind of problem.
    pub kind: ConfigErrorKind,
    /// What is wrong and what is expected.
    pub message: String,
}

/// An agent read from a file, with its sub-agents.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// The file it was read from.
    pub file: PathBuf,
    /// Its text (for pointing errors found later, e.g. an unknown model, at a line).
    pub text: String,
    /// Its settings.
    pub config: AgentConfig,
    /// Its sub-agents, in order.
    pub sub_agents: Vec<AgentSpec>,
    /// The agents its `AgentTool` tools name (`args: {agent: {config_path: ...}}`), in order.
    pub tool_agents: Vec<AgentSpec>,
}

impl AgentSpec {
    /// An error about this agent's file at the first line setting `key` (to `value`, if
    /// given).
    pub fn error_at(
        &self,
        key: &str,
        value: Option<&str>,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        self.error_at_nth(key, value, 0, kind, message)
    }

    /// [`AgentSpec::error_at`] the `n`th (0-based) such line: the second of two
    /// duplicates, say (the first line when there are fewer).
    pub(crate) fn error_at_nth(
        &self,
        key: &str,
        value: Option<&str>,
        n: usize,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        let found = locate(&self.text, key, value);
        let (line, column) = found.get(n).or(found.first()).copied().unwrap_or((1, 1));
        ConfigError {
            file: self.file.clone(),
            line,
            column,
            kind,
            message: message.into(),
        }
    }

    /// Whether this agent or one below it (a sub-agent, or an agent an `AgentTool` names) is a
    /// model's: an `LlmAgent` (a persona's too) or an `RlmAgent`. A workflow of Python steps
    /// and the agents that order and route them calls none (its code may still ask one).
    pub fn calls_models(&self) -> bool {
        matches!(self.config, AgentConfig::Llm(_) | AgentConfig::Rlm(_))
            || self
                .sub_agents
                .iter()
                .chain(&self.tool_agents)
                .any(AgentSpec::calls_models)
    }

    /// This agent and every agent below it, depth first.
    pub fn walk(&self) -> Vec<&AgentSpec> {
        let mut out = vec![self];
        for sub in &self.sub_agents {
            out.extend(sub.walk());
        }
        out
    }
}

/// Reads the workflow file at `path` and every file its sub-agents name.
pub fn load_workflow(path: impl AsRef<Path>) -> Result<AgentSpec, ConfigError> {
    load_workflow_from(&Filesystem, path)
}

/// [`load_workflow`] from `source`.
pub fn load_workflow_from(
    source: &dyn FileSource,
    path: impl AsRef<Path>,
) -> Result<AgentSpec, ConfigError> {
    let path = normalize(path.as_ref());
    let text = source.read(&path).map_err(|e| ConfigError {
        file: path.clone(),
        line: 1,
        column: 1,
        kind: ConfigErrorKind::Read,
        message: format!("Cannot read the workflow file: {e}"),
    })?;
    let mut open = HashSet::new();
    load_file(source, path, text, &mut open)
}

fn load_file(
    source: &dyn FileSource,
    file: PathBuf,
    text: String,
    open: &mut HashSet<PathBuf>,
) -> Result<AgentSpec, ConfigError> {
    open.insert(file.clone());
    let config = parse_config(&file, &text)?;
    let mut spec = AgentSpec {
        file: file.clone(),
        text,
        config,
        sub_agents: Vec::new(),
        tool_agents: Vec::new(),
    };
    let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
    let refs = spec.config.sub_agent_refs();
    if matches!(
        spec.config,
        AgentConfig::Loop(_)
            | AgentConfig::Sequential(_)
            | AgentConfig::Parallel(_)
            | AgentConfig::Graph(_)
            | AgentConfig::Router(_)
    ) && refs.is_empty()
    {
        return Err(spec.error_at(
            "sub_agents",
            None,
            ConfigErrorKind::Invalid,
            format!(
                "A {} needs at least one sub-agent under `sub_agents`",
                spec.config.class().as_str()
            ),
        ));
    }
    for path in agent_tool_paths(&spec)? {
        let child = load_ref(source, &spec, &dir, &path, open)?;
        spec.tool_agents.push(child);
    }
    for sub in refs {
        let child = load_ref(source, &spec, &dir, &sub.config_path, open)?;
        if let Some(twin) = spec
            .sub_agents
            .iter()
            .find(|s| s.config.name() == child.config.name())
        {
            return Err(child.error_at(
                "name",
                Some(child.config.name()),
                ConfigErrorKind::DuplicateName,
                format!(
                    "`{}` is also the name of the sub-agent in `{}`; sibling agents need unique \
                     names",
                    child.config.name(),
                    twin.file.display()
                ),
            ));
        }
        spec.sub_agents.push(child);
    }
    open.remove(&file);
    check_graph(&spec)?;
    check_router(&spec)?;
    Ok(spec)
}

/// The tool name under which `tools` names another agent (as in ADK).
pub(crate) const AGENT_TOOL: &str = "AgentTool";

/// The `config_path`s of an LLM agent's `AgentTool` tools.
fn agent_tool_paths(spec: &AgentSpec) -> Result<Vec<PathBuf>, ConfigError> {
    let AgentConfig::Llm(llm) = &spec.config else {
        return Ok(Vec::new());
    };
    llm.tools
        .iter()
        .filter(|t| t.name == AGENT_TOOL)
        .map(|tool| {
            tool.args
                .get("agent")
                .and_then(|a| a.get("config_path"))
                .and_then(|p| p.as_str())
                .map(PathBuf::from)
                .ok_or_else(|| {
                    spec.error_at(
                        "name",
                        Some(AGENT_TOOL),
                        ConfigErrorKind::Invalid,
                        format!(
                            "An `{AGENT_TOOL}` tool needs `args: {{agent: {{config_path: FILE}}}}` \
                             naming the agent's file"
                        ),
                    )
                })
        })
        .collect()
}

/// Reads the agent file `path` named (relative to `dir`) by `parent`.
fn load_ref(
    source: &dyn FileSource,
    parent: &AgentSpec,
    dir: &Path,
    path: &Path,
    open: &mut HashSet<PathBuf>,
) -> Result<AgentSpec, ConfigError> {
    let shown = path.display().to_string();
    let full = normalize(&dir.join(path));
    if open.contains(&full) {
        return Err(parent.error_at(
            "config_path",
            Some(&shown),
            ConfigErrorKind::Cycle,
            format!(
                "`{shown}` is already being read higher up this tree (a file cannot contain \
                 itself); point `config_path` at another file"
            ),
        ));
    }
    let text = source.read(&full).map_err(|e| {
        parent.error_at(
            "config_path",
            Some(&shown),
            ConfigErrorKind::Read,
            format!(
                "Cannot read agent file `{shown}` (`{}`): {e}; `config_path` is relative to \
                 this file",
                full.display()
            ),
        )
    })?;
    load_file(source, full, text, open)
}

/// The names of `spec`'s sub-agents, and an error maker for a name that is not one of them.
fn node_names(spec: &AgentSpec) -> (Vec<&str>, impl Fn(&str, &str, bool) -> ConfigError + '_) {
    let names: Vec<&str> = spec.sub_agents.iter().map(|s| s.config.name()).collect();
    let known = listed(&names);
    let kind = match spec.config {
        AgentConfig::Router(_) => "router",
        _ => "graph",
    };
    let unknown = move |key: &str, name: &str, end_ok: bool| {
        let or_end = if end_ok {
            format!(" or `{END}`")
        } else {
            String::new()
        };
        spec.error_at(
            key,
            Some(name),
            ConfigErrorKind::Invalid,
            format!("`{name}` is not a node of this {kind}; expected one of {known}{or_end}"),
        )
    };
    (names, unknown)
}

/// `condition` tests something, or an error at `key: value`.
fn check_condition(
    spec: &AgentSpec,
    condition: &Condition,
    key: &str,
    value: &str,
) -> Result<(), ConfigError> {
    condition
        .validate()
        .map_err(|e| spec.error_at(key, Some(value), ConfigErrorKind::Invalid, e.to_string()))
}

/// The edges and start of a graph name its nodes.
fn check_graph(spec: &AgentSpec) -> Result<(), ConfigError> {
    let AgentConfig::Graph(graph) = &spec.config else {
        return Ok(());
    };
    let (names, unknown) = node_names(spec);
    if !names.contains(&graph.start.as_str()) {
        return Err(unknown("start", &graph.start, false));
    }
    for edge in &graph.edges {
        if !names.contains(&edge.from.as_str()) {
            return Err(unknown("from", &edge.from, false));
        }
        if edge.to != END && !names.contains(&edge.to.as_str()) {
            return Err(unknown("to", &edge.to, true));
        }
        if let Some(when) = &edge.when {
            check_condition(spec, when, "from", &edge.from)?;
        }
    }
    Ok(())
}

/// A router's start, successors and recovery nodes name its nodes; its branches end with a
/// plain one; its gates test something and its retries are sane.
fn check_router(spec: &AgentSpec) -> Result<(), ConfigError> {
    let AgentConfig::Router(router) = &spec.config else {
        return Ok(());
    };
    let (names, unknown) = node_names(spec);
    let known = |name: &str| names.contains(&name);
    if let Some(topic) = &router.topic
        && topic.state_key.is_some() == topic.reply_field.is_some()
    {
        return Err(spec.error_at(
            "topic",
            None,
            ConfigErrorKind::Invalid,
            "`topic` needs exactly one of `state_key` (a state key holding the topic) and \
             `reply_field` (a field of the agent's JSON answer)",
        ));
    }
    if !known(&router.start) {
        return Err(unknown("start", &router.start, false));
    }
    for (from, next) in &router.successors {
        if !known(from) {
            return Err(spec.error_at(
                from,
                None,
                ConfigErrorKind::Invalid,
                format!(
                    "`successors` names `{from}`, which is not a node of this router; expected \
                     one of {}",
                    listed(&names)
                ),
            ));
        }
        match next {
            SuccessorConfig::Node(to) if to != END && !known(to) => {
                return Err(unknown(from, to, true));
            }
            SuccessorConfig::Node(_) => {}
            SuccessorConfig::Branches(branches) => {
                for branch in branches {
                    if branch.to != END && !known(&branch.to) {
                        return Err(unknown("to", &branch.to, true));
                    }
                    if let Some(when) = &branch.when {
                        check_condition(spec, when, "to", &branch.to)?;
                    }
                }
                if branches.last().is_none_or(|b| b.when.is_some()) {
                    return Err(spec.error_at(
                        from,
                        None,
                        ConfigErrorKind::Invalid,
                        format!(
                            "The branches after `{from}` need a last plain one (`- to: NODE` \
                             without `when`), so that one is always taken"
                        ),
                    ));
                }
            }
        }
    }
    for (gate, node) in &router.recovery {
        if !known(node) {
            return Err(unknown(gate, node, false));
        }
    }
    let mut gates = Vec::new();
    for node in &router.sub_agents {
        for gate in &node.gates {
            let seen = gates.iter().filter(|g| **g == gate.name.as_str()).count();
            let at = |message: String| {
                let (name, kind) = (Some(gate.name.as_str()), ConfigErrorKind::Invalid);
                spec.error_at_nth("name", name, seen, kind, message)
            };
            if seen > 0 {
                return Err(at(format!(
                    "There are two gates named `{}`; gate names must be unique (`recovery` is \
                     declared per gate name)",
                    gate.name
                )));
            }
            gates.push(gate.name.as_str());
            match (&gate.when, &gate.python) {
                (Some(when), None) => check_condition(spec, when, "name", &gate.name)?,
                (None, Some(_)) => {}
                _ => {
                    return Err(at(format!(
                        "Gate `{}` needs exactly one of `when` (a state test) and `python` (a \
                         check function)",
                        gate.name
                    )));
                }
            }
        }
        let retry = &node.retry;
        let bad = [("initial", retry.initial), ("max", retry.max)]
            .into_iter()
            .find(|(_, secs)| secs.is_some_and(|s| !s.is_finite() || s < 0.0));
        if let Some((key, _)) = bad {
            return Err(spec.error_at(
                key,
                None,
                ConfigErrorKind::Invalid,
                format!("`retry.{key}` must be a number of seconds, 0 or more"),
            ));
        }
    }
    if let Some(gate) = router
        .recovery
        .keys()
        .find(|g| !gates.contains(&g.as_str()))
    {
        return Err(spec.error_at(
            gate,
            None,
            ConfigErrorKind::Invalid,
            format!(
                "`recovery` names gate `{gate}`, which no node declares; gates: {}",
                listed(&gates)
            ),
        ));
    }
    Ok(())
}

/// `` `a`, `b` `` (or "none").
pub(crate) fn listed<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    let list: Vec<String> = names
        .into_iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect();
    if list.is_empty() {
        "none".to_owned()
    } else {
        list.join(", ")
    }
}

/// Just the class, read before the whole agent so the right struct checks the keys.
struct ClassProbe {
    agent_class: AgentClass,
}

impl<'de> Deserialize<'de> for ClassProbe {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Probe;
        impl<'de> serde::de::Visitor<'de> for Probe {
            type Value = ClassProbe;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping of agent settings (`name: ...`, `agent_class: ...`)")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ClassProbe, A::Error> {
                let mut agent_class = AgentClass::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "agent_class" {
                        agent_class = map.next_value()?;
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(ClassProbe { agent_class })
            }
        }
        deserializer.deserialize_map(Probe)
    }
}

fn parse_config(file: &Path, text: &str) -> Result<AgentConfig, ConfigError> {
    let probe: ClassProbe = parse(file, text)?;
    Ok(match probe.agent_class {
        AgentClass::LlmAgent => AgentConfig::Llm(parse(file, text)?),
        AgentClass::LoopAgent => AgentConfig::Loop(parse(file, text)?),
        AgentClass::SequentialAgent => AgentConfig::Sequential(parse(file, text)?),
        AgentClass::ParallelAgent => AgentConfig::Parallel(parse(file, text)?),
        AgentClass::GraphAgent => AgentConfig::Graph(parse(file, text)?),
        AgentClass::RouterAgent => AgentConfig::Router(parse(file, text)?),
        AgentClass::RlmAgent => AgentConfig::Rlm(parse(file, text)?),
        AgentClass::PythonAgent => AgentConfig::Python(parse(file, text)?),
    })
}

fn parse<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    crate::document::from_yaml(text).map_err(|e| ConfigError {
        file: file.to_owned(),
        line: e.line,
        column: e.column,
        kind: ConfigErrorKind::Schema,
        message: with_key_path(&e.message),
    })
}

/// The parser's message with its key path (`tools[0]: ...`) in backticks and the message
/// itself capitalized.
fn with_key_path(message: &str) -> String {
    let is_path = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'))
    };
    match message.split_once(": ") {
        Some((path, rest)) if is_path(path) => format!("`{path}`: {}", capitalized(rest)),
        _ => capitalized(message),
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The lines and columns of every `key:` (set to `value`, if given) in `text`, as a list item
/// or not, in order; when there is none, of every `key: value` inside a flow mapping
/// (`{from: a, to: b}`).
fn locate(text: &str, key: &str, value: Option<&str>) -> Vec<(usize, usize)> {
    let unquoted = |s: &str| s.trim().trim_matches(|c| c == '"' || c == '\'').to_owned();
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let item = trimmed.strip_prefix("- ").map_or(trimmed, str::trim_start);
        let Some(rest) = item.strip_prefix(key).and_then(|r| r.strip_prefix(':')) else {
            continue;
        };
        if value.is_none_or(|v| v == unquoted(rest)) {
            found.push((i + 1, line.len() - item.len() + 1));
        }
    }
    if !found.is_empty() {
        return found;
    }
    for (i, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices(&format!("{key}:")) {
            let before = line[..at].trim_end().chars().last();
            if !matches!(before, Some('{' | ',')) {
                continue;
            }
            let rest = &line[at + key.len() + 1..];
            let item = rest.split([',', '}']).next().unwrap_or_default();
            if value.is_none_or(|v| v == unquoted(item)) {
                found.push((i + 1, line[..at].chars().count() + 1));
            }
        }
    }
    found
}
