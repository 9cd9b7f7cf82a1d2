//! The inputs a workflow needs from whoever starts it, found before it runs.
//!
//! An instruction's `{key}` (not `{key?}`, see [`render_template`]) must hold a value when
//! its agent runs, or the agent fails. The workflow itself *provides* a key when an agent
//! names it as its `output_key`, or when something that runs may write it: a Python step,
//! tool or callback whose file names the key in quotes (`"draft"`, `'draft'`), or a step the
//! caller knows (the kernel's context loader). Another function of
//! a module, and a tool or callback of the engine other than the actions `exit_loop`,
//! `end_turn` and `escalate`, may write any key: a workflow that has one provides every key,
//! as far as this check can tell. The run's own keys (`human_input`, the router's) are
//! provided too. A needed key the workflow does not provide must come from the caller;
//! [`missing_inputs`] lists those the run was not given, each with the agents (and the file
//! and line) that need it and, when its name is close to a key the workflow knows, that key
//! (a likely typo).
//!
//! The check errs one way: it never lists a key something in the workflow may set, unless a
//! Python function builds the key's name at run time (name it in quotes in the file, or pass
//! it). So a listed key is missing for certain when its agent runs, and the CLI refuses the
//! run before anything is written.
//!
//! A Python step's function is called with the state (or its `ctx`) and the step's `args`
//! as keyword arguments: [`missing_arguments`] lists the steps whose function, read from its
//! file, has a parameter without a default that `args` leave out. It errs the same way: a
//! function it cannot read for certain (a module's, a decorated one) is not listed.
//!
//! [`render_template`]: crate::flow::render_template

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::durable::HUMAN_INPUT;
use crate::flow::file::{AgentConfig, AgentSpec, CodeRef, FileSource};
use crate::route::decide::{DECISIONS, ESCALATE_FLAG, FAILURE_FLAG, GATE_BLOCKED, MESSAGES, keys};
use crate::route::gate::GATE_WARNINGS;

/// One key a run needs and was not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingInput {
    /// The state key.
    pub key: String,
    /// Where it is needed: the agent, its file and the line of the `{key}`.
    pub needed_by: Vec<NeededAt>,
    /// A key the workflow knows whose name is close: `{key}` is likely a typo of it.
    pub close_to: Option<String>,
}

/// An agent's instruction that needs a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeededAt {
    /// The agent's name.
    pub agent: String,
    /// Its file.
    pub file: PathBuf,
    /// The line of the instruction's `{key}` in that file (1-based).
    pub line: usize,
}

/// A Python step whose function has required parameters its `args` do not give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingArguments {
    /// The step's agent name.
    pub agent: String,
    /// The step's file.
    pub file: PathBuf,
    /// Its `function` (`file.py:name`).
    pub function: String,
    /// The parameters without a default that `args` leaves out, in the signature's order.
    pub names: Vec<String>,
}

/// What may write state keys as a workflow runs.
#[derive(Debug, Default)]
struct Provided {
    keys: BTreeSet<String>,
    /// Something may write any key.
    any: bool,
}

impl Provided {
    /// The keys a Python function `reference` may write: those its file names in quotes
    /// (`file.py:function`, relative to `base`); a module's function may write any key.
    fn python(&mut self, source: &dyn FileSource, reference: &str, base: &Path) {
        let file = match reference.rsplit_once(':') {
            Some((place, _)) if place.ends_with(".py") => base.join(place),
            _ => {
                self.any = true;
                return;
            }
        };
        match source.read(&file) {
            Ok(text) => self.keys.extend(quoted_words(&text)),
            // Unreadable here: the run says so when it gets there; assume the worst.
            Err(_) => self.any = true,
        }
    }

    /// A callback may write what its Python file names; an engine callback anything.
    fn callback(&mut self, source: &dyn FileSource, code: &CodeRef, root_dir: &Path) {
        if is_python_reference(&code.name) {
            self.python(source, &code.name, root_dir);
        } else {
            self.any = true;
        }
    }
}

/// The keys a router writes as it routes.
const ROUTER_KEYS: [&str; 10] = [
    keys::ROUTING_DECISION,
    keys::ROUTING_RATIONALE,
    keys::EXCHANGE_COUNT,
    keys::CIRCULAR_LOGIC_DETECTED,
    keys::ESCALATION_TRIGGERED,
    DECISIONS,
    ESCALATE_FLAG,
    FAILURE_FLAG,
    GATE_BLOCKED,
    GATE_WARNINGS,
];

/// The engine's tools that act on the run and write no state.
const ACTIONS: [&str; 3] = ["exit_loop", "end_turn", "escalate"];

/// Whether `name` names a Python function (`file.py:function`, `module:function`,
/// `module.function`) rather than a tool or callback of the engine.
fn is_python_reference(name: &str) -> bool {
    name.contains(':') || name.contains('.')
}

/// The keys a step of the caller's own writes (the kernel's `rlm:load_contexts`, say),
/// given the step's `function` and `args`; `None` for a function it does not know.
pub(crate) type KnownSteps<'a> = &'a dyn Fn(&str, &Map<String, Value>) -> Option<Vec<String>>;

/// The keys of `root`'s instructions that neither `given` (the run's starting state) nor
/// the workflow provides (see the module docs), in the order of their names. Python files
/// are read from `source`: steps' relative to their own file, tools' and callbacks' relative
/// to the root file's folder; `known` says what the caller's own steps write.
pub fn missing_inputs(
    root: &AgentSpec,
    given: &BTreeSet<String>,
    source: &dyn FileSource,
    known: KnownSteps<'_>,
) -> Vec<MissingInput> {
    let root_dir = root.file.parent().unwrap_or(Path::new(""));
    let mut provided = Provided::default();
    // The run's own: a human's answer, and the messages of a routed run's agents.
    provided
        .keys
        .extend([HUMAN_INPUT, MESSAGES].map(str::to_owned));
    let mut needed: BTreeMap<String, Vec<NeededAt>> = BTreeMap::new();
    for spec in all_agents(root) {
        let base = spec.file.parent().unwrap_or(Path::new(""));
        for (_, code) in spec.config.callbacks().all() {
            provided.callback(source, code, root_dir);
        }
        let (instruction, output_key, tools) = match &spec.config {
            AgentConfig::Llm(c) => (&c.instruction, &c.output_key, c.tools.as_slice()),
            AgentConfig::Rlm(c) => (&c.instruction, &c.output_key, &[][..]),
            AgentConfig::Python(c) => {
                match known(&c.function, &c.args) {
                    Some(keys) => provided.keys.extend(keys),
                    None => provided.python(source, &c.function, base),
                }
                continue;
            }
            AgentConfig::Router(_) => {
                provided
                    .keys
                    .extend(ROUTER_KEYS.iter().map(|k| (*k).to_owned()));
                continue;
            }
            _ => continue,
        };
        provided.keys.extend(output_key.iter().cloned());
        for tool in tools {
            if ACTIONS.contains(&tool.name.as_str()) {
                continue;
            }
            if is_python_reference(&tool.name) {
                provided.python(source, &tool.name, root_dir);
            } else {
                // An engine tool (or an agent as a tool): it may write anything.
                provided.any = true;
            }
        }
        for (key, offset) in required_keys(instruction) {
            needed.entry(key).or_default().push(NeededAt {
                agent: spec.config.name().to_owned(),
                file: spec.file.clone(),
                line: line_of(spec, instruction, offset),
            });
        }
    }
    if provided.any {
        return Vec::new();
    }
    let known: BTreeSet<&str> = provided
        .keys
        .iter()
        .chain(given)
        .map(String::as_str)
        .collect();
    // A typo is close to a key the workflow knows, given or needed elsewhere.
    let names: BTreeSet<&str> = known
        .iter()
        .copied()
        .chain(needed.keys().map(String::as_str))
        .collect();
    needed
        .iter()
        .filter(|(key, _)| !known.contains(key.as_str()))
        .map(|(key, needed_by)| {
            let others: BTreeSet<&str> = names.iter().copied().filter(|n| n != key).collect();
            MissingInput {
                close_to: closest(key, &others),
                key: key.clone(),
                needed_by: needed_by.clone(),
            }
        })
        .collect()
}

/// The Python steps of `root` (`function: file.py:name`) whose function has a parameter
/// without a default that the step's `args` do not give (the step's call would fail with a
/// `TypeError`). The first parameter (or `ctx`, when the function has one) is the state or
/// the step's context, given by the run. A function this cannot read for certain (a module's,
/// one not defined at the top of its file, a decorated one, an unreadable file) is not
/// listed: its call says what is wrong.
pub fn missing_arguments(root: &AgentSpec, source: &dyn FileSource) -> Vec<MissingArguments> {
    let mut out = Vec::new();
    for spec in all_agents(root) {
        let AgentConfig::Python(c) = &spec.config else {
            continue;
        };
        let Some((place, function)) = c.function.rsplit_once(':') else {
            continue;
        };
        if !place.ends_with(".py") {
            continue;
        }
        let base = spec.file.parent().unwrap_or(Path::new(""));
        let Ok(text) = source.read(&base.join(place)) else {
            continue;
        };
        let Some(required) = required_parameters(&text, function) else {
            continue;
        };
        let names: Vec<String> = required
            .into_iter()
            .filter(|name| !c.args.contains_key(name))
            .collect();
        if !names.is_empty() {
            out.push(MissingArguments {
                agent: spec.config.name().to_owned(),
                file: spec.file.clone(),
                function: c.function.clone(),
                names,
            });
        }
    }
    out
}

/// The parameters of the top-level function `name` of Python `text` that have no default,
/// without the one the run gives (`ctx`, else the first positional one) and without `*args`
/// and `**kwargs`; `None` when the function is not defined with a plain `def` at the top of
/// the text, is decorated, or its parameters cannot be read.
fn required_parameters(text: &str, name: &str) -> Option<Vec<String>> {
    let header = format!("def {name}(");
    let mut offset = 0;
    let mut previous = "";
    let mut start = None;
    for line in text.split_inclusive('\n') {
        if line.starts_with(&header) {
            if previous.starts_with('@') || start.is_some() {
                // Decorated, or defined twice: the one that counts is not certain.
                return None;
            }
            start = Some(offset + header.len());
        }
        if !line.trim().is_empty() && !line.starts_with(' ') && !line.starts_with('\t') {
            previous = line;
        }
        offset += line.len();
    }
    let list = &text[start?..];
    let pieces = split_parameters(list)?;
    let mut params: Vec<(String, bool)> = Vec::new();
    for piece in &pieces {
        let piece = piece.trim();
        if piece.is_empty() || piece == "/" || piece == "*" {
            continue;
        }
        if piece.starts_with('*') {
            continue;
        }
        let name_end = piece
            .find(|c: char| c == ':' || c == '=' || c.is_whitespace())
            .unwrap_or(piece.len());
        let param = &piece[..name_end];
        if !param.chars().all(|c| c.is_alphanumeric() || c == '_') || param.is_empty() {
            return None;
        }
        params.push((param.to_owned(), has_default(piece)));
    }
    let given = if params.iter().any(|(p, _)| p == "ctx") {
        "ctx".to_owned()
    } else {
        params.first()?.0.clone()
    };
    Some(
        params
            .into_iter()
            .filter(|(p, default)| !default && *p != given)
            .map(|(p, _)| p)
            .collect(),
    )
}

/// The comma-separated pieces of a parameter list that starts after its `(`, up to its
/// `)`, split at the commas outside brackets, strings and comments; `None` when the list
/// does not close.
fn split_parameters(list: &str) -> Option<Vec<String>> {
    let mut pieces = vec![String::new()];
    let mut depth = 0usize;
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                chars.by_ref().find(|&d| d == '\n');
                continue;
            }
            '"' | '\'' => {
                let mut escaped = false;
                let mut text = String::from(c);
                for d in chars.by_ref() {
                    text.push(d);
                    if d == c && !escaped {
                        break;
                    }
                    escaped = d == '\\' && !escaped;
                }
                pieces.last_mut()?.push_str(&text);
                continue;
            }
            '(' | '[' | '{' => depth += 1,
            ')' if depth == 0 => return Some(pieces),
            ')' | ']' | '}' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                pieces.push(String::new());
                continue;
            }
            _ => {}
        }
        pieces.last_mut()?.push(c);
    }
    None
}

/// Whether a parameter `piece` (`name: type = value`) has a default: an `=` outside
/// brackets and strings.
fn has_default(piece: &str) -> bool {
    let mut depth = 0usize;
    let mut quote = None;
    for c in piece.chars() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            (None, '=') if depth == 0 => return true,
            _ => {}
        }
    }
    false
}

/// `root` and every agent below it, its agent tools' agents included.
fn all_agents(root: &AgentSpec) -> Vec<&AgentSpec> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(spec) = stack.pop() {
        out.push(spec);
        stack.extend(spec.sub_agents.iter().rev());
        stack.extend(spec.tool_agents.iter().rev());
    }
    out
}

/// The keys `{key}` (not `{key?}`) of `template`, with the byte offset of each `{`, as
/// [`render_template`](crate::flow::render_template) fills them.
fn required_keys(template: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(open) = template[at..].find('{').map(|i| at + i) {
        let after = &template[open + 1..];
        let Some(close) = after.find('}') else { break };
        let inner = &after[..close];
        if !inner.ends_with('?') && crate::flow::template::is_key(inner) {
            found.push((inner.to_owned(), open));
            at = open + 1 + close + 1;
        } else {
            at = open + 1;
        }
    }
    found
}

/// The line of `spec`'s file that holds byte `offset` of `instruction` (the first line of
/// the file that holds the text around it; else the `instruction:` line).
fn line_of(spec: &AgentSpec, instruction: &str, offset: usize) -> usize {
    let line_start = instruction[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = instruction[offset..]
        .find('\n')
        .map_or(instruction.len(), |i| offset + i);
    let needle = instruction[line_start..line_end].trim();
    spec.text
        .lines()
        .position(|line| !needle.is_empty() && line.contains(needle))
        .or_else(|| {
            spec.text
                .lines()
                .position(|line| line.trim_start().starts_with("instruction:"))
        })
        .map_or(1, |i| i + 1)
}

/// Every string literal of a Python text that could be a state key (as a template may
/// name one): the text in single or double quotes on one
/// line, outside comments. (A triple-quoted string reads as empty strings around one more:
/// what it holds may count as a key, which only makes the check list less.)
fn quoted_words(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for line in text.lines() {
        let mut chars = line.char_indices();
        while let Some((start, c)) = chars.next() {
            match c {
                '#' => break,
                '"' | '\'' => {
                    let mut escaped = false;
                    let end = chars.by_ref().find_map(|(i, d)| {
                        let closes = d == c && !escaped;
                        escaped = d == '\\' && !escaped;
                        closes.then_some(i)
                    });
                    let Some(end) = end else { break };
                    let word = &line[start + 1..end];
                    if crate::flow::template::is_key(word) {
                        words.insert(word.to_owned());
                    }
                }
                _ => {}
            }
        }
    }
    words
}

/// The key of `known` closest to `key`, when it is close enough to be what was meant: at
/// most one edit in four characters, and at least one.
fn closest(key: &str, known: &BTreeSet<&str>) -> Option<String> {
    let limit = (key.chars().count() / 4).max(1);
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, k)| k.to_owned())
}

/// The edit distance of `a` and `b` in characters, a swap of two neighbours counting as one
/// edit (the optimal string alignment distance: `breif` is one edit from `brief`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::file::{EmbeddedFiles, load_workflow_from};

    fn missing(files: &EmbeddedFiles, given: &[&str]) -> Vec<MissingInput> {
        let spec = load_workflow_from(files, "flows/root.yaml").expect("valid files");
        let given = given.iter().map(|k| (*k).to_owned()).collect();
        let known = |function: &str, _: &Map<String, Value>| {
            (function == "lib:load").then(|| vec!["loaded".to_owned()])
        };
        missing_inputs(&spec, &given, files, &known)
    }

    fn seq(steps: &[&str]) -> String {
        let subs: String = steps
            .iter()
            .map(|s| format!("  - config_path: {s}.yaml\n"))
            .collect();
        format!("agent_class: SequentialAgent\nname: root\nsub_agents:\n{subs}")
    }

    #[test]
    fn a_key_no_input_and_no_agent_provides_is_listed_with_where_it_is_needed() {
        let files = EmbeddedFiles::new()
            .with("flows/root.yaml", seq(&["brief", "plan"]))
            .with(
                "flows/brief.yaml",
                "name: brief\ninstruction: |\n  Summarise.\n\n  Request: {request}\noutput_key: brief\n",
            )
            .with(
                "flows/plan.yaml",
                "name: plan\ninstruction: Plan {brief} for {request} ({tone?}).\n",
            );
        let found = missing(&files, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "request");
        let at: Vec<(&str, usize)> = found[0]
            .needed_by
            .iter()
            .map(|n| (n.agent.as_str(), n.line))
            .collect();
        assert_eq!(at, [("brief", 5), ("plan", 2)]);
        assert_eq!(found[0].close_to, None);
        assert!(missing(&files, &["request"]).is_empty());
    }

    #[test]
    fn a_typo_is_listed_with_the_key_it_is_close_to() {
        let files = EmbeddedFiles::new()
            .with("flows/root.yaml", seq(&["brief", "plan"]))
            .with(
                "flows/brief.yaml",
                "name: brief\ninstruction: Go.\noutput_key: brief\n",
            )
            .with(
                "flows/plan.yaml",
                "name: plan\ninstruction: Plan {breif}.\n",
            );
        let found = missing(&files, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "breif");
        assert_eq!(found[0].close_to.as_deref(), Some("brief"));
    }

    #[test]
    fn python_steps_provide_the_keys_their_file_names_and_modules_any_key() {
        let files = EmbeddedFiles::new()
            .with("flows/root.yaml", seq(&["prepare", "write"]))
            .with(
                "flows/prepare.yaml",
                "agent_class: PythonAgent\nname: prepare\nfunction: steps.py:prepare\n",
            )
            .with(
                "flows/steps.py",
                "def prepare(state):\n    return {'outline': 1}\n",
            )
            .with(
                "flows/write.yaml",
                "name: write\ninstruction: Write {outline} for {topic}.\n",
            );
        let found = missing(&files, &[]);
        assert_eq!(
            found.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(),
            ["topic"]
        );
        let files = files.with(
            "flows/prepare.yaml",
            "agent_class: PythonAgent\nname: prepare\nfunction: steps.prepare\n",
        );
        assert!(
            missing(&files, &[]).is_empty(),
            "a module may write anything"
        );
        // A step the caller knows writes what it says.
        let files = files
            .with(
                "flows/prepare.yaml",
                "agent_class: PythonAgent\nname: prepare\nfunction: lib:load\n",
            )
            .with(
                "flows/write.yaml",
                "name: write\ninstruction: Write {loaded}, {topic}.\n",
            );
        assert_eq!(
            missing(&files, &[])
                .iter()
                .map(|m| m.key.as_str())
                .collect::<Vec<_>>(),
            ["topic"]
        );
    }

    #[test]
    fn engine_tools_and_callbacks_may_write_anything_but_actions_nothing() {
        let agent =
            |tools: &str| format!("name: write\ninstruction: Write {{topic}}.\ntools:\n{tools}");
        let files = EmbeddedFiles::new()
            .with("flows/root.yaml", seq(&["write"]))
            .with("flows/write.yaml", agent("  - name: exit_loop\n"));
        assert_eq!(missing(&files, &[]).len(), 1);
        let files = files.with("flows/write.yaml", agent("  - name: request_discovery\n"));
        assert!(missing(&files, &[]).is_empty());
        let files = files.with(
            "flows/write.yaml",
            "name: write\ninstruction: Write {topic}.\nbefore_agent_callbacks:\n  - name: \
             prepare\n",
        );
        assert!(missing(&files, &[]).is_empty());
    }

    #[test]
    fn a_python_steps_required_parameters_come_from_its_args() {
        let steps = "import json\n\n\ndef tidy(ctx, limit, *, sep: str = \",\", mode=(1, 2), **more):\n    \
                     return None\n\n\ndef legacy(\n    state,  # the state\n    rows: dict[str, int],\n    \
                     tag='a,b',\n):\n    return {}\n\n\n@decorated\ndef wrapped(state, x):\n    return {}\n";
        let step = |name: &str, function: &str, args: &str| {
            format!("agent_class: PythonAgent\nname: {name}\nfunction: steps.py:{function}\n{args}")
        };
        let files = EmbeddedFiles::new()
            .with("flows/root.yaml", seq(&["a", "b", "c", "d"]))
            .with("flows/steps.py", steps)
            .with("flows/a.yaml", step("a", "tidy", ""))
            .with("flows/b.yaml", step("b", "legacy", "args:\n  rows: {}\n"))
            .with("flows/c.yaml", step("c", "wrapped", ""))
            .with("flows/d.yaml", step("d", "legacy", ""));
        let spec = load_workflow_from(&files, "flows/root.yaml").expect("valid files");
        let found: Vec<(String, Vec<String>)> = missing_arguments(&spec, &files)
            .into_iter()
            .map(|m| (m.agent, m.names))
            .collect();
        assert_eq!(
            found,
            [
                ("a".to_owned(), vec!["limit".to_owned()]),
                ("d".to_owned(), vec!["rows".to_owned()]),
            ]
        );
        assert_eq!(required_parameters("def f(a, b=1):\n", "f"), Some(vec![]));
        assert_eq!(required_parameters("def f(a, b\n", "f"), None);
        assert_eq!(required_parameters("def g(a):\n", "f"), None);
        assert_eq!(
            required_parameters("def f(x, y, /, z, *rest, k):\n", "f"),
            Some(vec!["y".to_owned(), "z".to_owned(), "k".to_owned()])
        );
    }

    #[test]
    fn quoted_words_and_close_keys() {
        let words = quoted_words(
            "x = state.get(\"draft\")  # don't 'note'\ny = {'temp:round': 1, \"it's\": 2, 'a\\'b': 3}",
        );
        assert_eq!(
            words.into_iter().collect::<Vec<_>>(),
            ["draft", "temp:round"]
        );
        assert_eq!(edit_distance("request", "reqest"), 1);
        assert_eq!(edit_distance("breif", "brief"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        let known: BTreeSet<&str> = ["request", "brief"].into();
        assert_eq!(closest("reqest", &known).as_deref(), Some("request"));
        assert_eq!(closest("story", &known), None);
    }
}
