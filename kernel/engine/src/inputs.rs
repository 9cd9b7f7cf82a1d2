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
pub type KnownSteps<'a> = &'a dyn Fn(&str, &Map<String, Value>) -> Option<Vec<String>>;

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
