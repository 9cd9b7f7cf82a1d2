//! Agent Skills: folders holding a `SKILL.md` (YAML front matter with `name` and
//! `description`, then instructions) and whatever files those instructions name
//! (`references/`, `assets/`, `scripts/`, step files).
//!
//! Skills are disclosed progressively, as the format intends: a [`SkillSet`] is found once
//! (the `--skills` folders, then the conventional folders of the project,
//! [`PROJECT_SKILL_FOLDERS`]) by reading each `SKILL.md`'s front matter for the catalog the
//! system prompt lists; a skill's instructions are read only when it is loaded, and its other
//! files only when those instructions need them.
//!
//! The front matter is checked as the Agent Skills specification says: `name` (1 to 64
//! lowercase letters, digits and hyphens, no hyphen at either end or twice in a row, the same
//! as the folder's name) and `description` (1 to 1024 characters) are required;
//! `compatibility` is at most 500 characters and `metadata` maps names to text. A malformed
//! one is an error naming the file and the line. Other keys, which some tools add, are
//! ignored. When two folders hold a skill of the same name, the first found wins and the
//! other is reported as shadowed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::BundleError;
use super::render::renders;
use super::sandbox::Sandbox;
use super::yaml::line_of_key;
use crate::document;

/// Where skills are installed in a project, in the order they are searched: the
/// cross-tool `.agents/skills/` and Claude Code's `.claude/skills/` first, then every other
/// folder BMAD's installer has written skills to for the tools it supports (the
/// `target_dir`s of its `platform-codes.yaml`, 6.1 to 6.12 and after).
pub(crate) const PROJECT_SKILL_FOLDERS: [&str; 34] = [
    ".agents/skills",
    ".claude/skills",
    ".adal/skills",
    ".agent/skills",
    ".augment/skills",
    ".bob/skills",
    ".cline/skills",
    ".codebuddy/skills",
    ".codewhale/skills",
    ".cortex/skills",
    ".crush/skills",
    ".cursor/skills",
    ".factory/skills",
    ".firebender/skills",
    ".gemini/skills",
    ".github/skills",
    ".iflow/skills",
    ".junie/skills",
    ".kilocode/skills",
    ".kimi/skills",
    ".kiro/skills",
    ".kode/skills",
    ".neovate/skills",
    ".ona/skills",
    ".opencode/skills",
    ".pi/skills",
    ".qoder/skills",
    ".qwen/skills",
    ".roo/skills",
    ".rovodev/skills",
    ".trae/skills",
    ".windsurf/skills",
    ".zcode/skills",
    ".zencoder/skills",
];

/// The file that makes a folder a skill.
pub(crate) const SKILL_FILE: &str = "SKILL.md";

/// The most entries of one skills folder looked at (a folder of skills is small; this
/// bounds a huge folder named by mistake).
const MAX_FOLDER_ENTRIES: usize = 2000;

/// The longest `name`, `description` and `compatibility` the specification allows.
const MAX_NAME_CHARS: usize = 64;
const MAX_DESCRIPTION_CHARS: usize = 1024;
const MAX_COMPATIBILITY_CHARS: usize = 500;

/// One skill: what its front matter says and where it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skill {
    /// Its `name`.
    pub(crate) name: String,
    /// Its `description`: what it does and when to use it.
    pub(crate) description: String,
    /// Its folder (canonical).
    pub dir: PathBuf,
    /// Its `SKILL.md` (canonical).
    pub(crate) file: PathBuf,
    /// Its `license`, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) license: Option<String>,
    /// Its `compatibility` (what it needs to run), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) compatibility: Option<String>,
    /// Its `metadata`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) metadata: BTreeMap<String, String>,
    /// Its `allowed-tools` (experimental in the specification; shown, not enforced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) allowed_tools: Option<String>,
    /// Whether its instructions say to render its workflow (BMAD's `render_skill.py`), which
    /// rlm does as its files are read (see `render`).
    #[serde(skip)]
    pub(crate) rendered: bool,
}

/// A `SKILL.md` split into its checked front matter and its instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SkillFile {
    /// The skill.
    pub(crate) skill: Skill,
    /// The instructions after the front matter, trimmed.
    pub(crate) body: String,
}

impl SkillFile {
    /// Parses and checks the `SKILL.md` at `file` (canonical), whose text is `text`.
    pub(crate) fn parse(file: &Path, text: &str) -> Result<Self, BundleError> {
        let malformed = |line: usize, problem: String| BundleError::Malformed {
            path: file.to_owned(),
            line,
            problem,
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text.split_inclusive('\n');
        if lines.next().map(str::trim_end) != Some("---") {
            return Err(malformed(
                1,
                "A `SKILL.md` starts with YAML front matter between two `---` lines, holding \
                 `name` and `description`"
                    .to_owned(),
            ));
        }
        let start = text.find('\n').map_or(text.len(), |i| i + 1);
        let mut offset = start;
        let mut end = None;
        for line in lines {
            if line.trim_end() == "---" {
                end = Some((offset, offset + line.len()));
                break;
            }
            offset += line.len();
        }
        let Some((yaml_end, body_start)) = end else {
            return Err(malformed(
                1,
                "The front matter is never closed; end it with a line of `---`".to_owned(),
            ));
        };
        let yaml = &text[start..yaml_end];
        let value: serde_json::Value = match document::from_yaml(yaml) {
            Ok(value) => value,
            Err(e) => {
                let hint = if e.message.contains("mapping values are not allowed") {
                    " (a value holding `: ` must be quoted)"
                } else {
                    ""
                };
                return Err(malformed(
                    e.line + 1,
                    format!("The front matter is not valid YAML: {}{hint}", e.message),
                ));
            }
        };
        let serde_json::Value::Object(fields) = value else {
            return Err(malformed(
                2,
                "The front matter must be a mapping of `key: value` lines".to_owned(),
            ));
        };
        // The front matter starts on line 2.
        let line_of = |key: &str| 1 + line_of_key(yaml, key);
        let text_field = |key: &str| -> Result<Option<String>, BundleError> {
            match fields.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.trim().to_owned())),
                Some(_) => Err(malformed(line_of(key), format!("`{key}` must be text"))),
            }
        };
        let folder = file
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = text_field("name")?
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                malformed(
                    2,
                    format!(
                        "The front matter has no `name`; add `name: {folder}` (the folder's name)"
                    ),
                )
            })?;
        if let Some(problem) = name_problem(&name) {
            return Err(malformed(line_of("name"), problem));
        }
        if name != folder {
            return Err(malformed(
                line_of("name"),
                format!(
                    "The skill is named `{name}` but its folder is `{folder}`; a skill's name \
                     is its folder's name: rename one of them"
                ),
            ));
        }
        let description = text_field("description")?
            .filter(|d| !d.is_empty())
            .ok_or_else(|| {
                malformed(
                    2,
                    "The front matter has no `description`; say what the skill does and when \
                     to use it (at most 1024 characters)"
                        .to_owned(),
                )
            })?;
        let chars = description.chars().count();
        if chars > MAX_DESCRIPTION_CHARS {
            return Err(malformed(
                line_of("description"),
                format!(
                    "The `description` is {chars} characters long, over the limit of \
                     {MAX_DESCRIPTION_CHARS}"
                ),
            ));
        }
        let compatibility = text_field("compatibility")?;
        if let Some(chars) = compatibility
            .as_ref()
            .map(|c| c.chars().count())
            .filter(|n| *n > MAX_COMPATIBILITY_CHARS)
        {
            return Err(malformed(
                line_of("compatibility"),
                format!(
                    "The `compatibility` is {chars} characters long, over the limit of \
                     {MAX_COMPATIBILITY_CHARS}"
                ),
            ));
        }
        let metadata = match fields.get("metadata") {
            None | Some(serde_json::Value::Null) => BTreeMap::new(),
            Some(serde_json::Value::Object(map)) => {
                let mut metadata = BTreeMap::new();
                for (key, value) in map {
                    let value = match value {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Number(n) => n.to_string(),
                        serde_json::Value::Bool(b) => b.to_string(),
                        _ => {
                            return Err(malformed(
                                line_of("metadata"),
                                format!("`metadata.{key}` must be text"),
                            ));
                        }
                    };
                    metadata.insert(key.clone(), value);
                }
                metadata
            }
            Some(_) => {
                return Err(malformed(
                    line_of("metadata"),
                    "`metadata` must map names to text".to_owned(),
                ));
            }
        };
        let skill = Skill {
            name,
            description,
            dir: file.parent().unwrap_or(file).to_owned(),
            file: file.to_owned(),
            license: text_field("license")?,
            compatibility,
            metadata,
            allowed_tools: text_field("allowed-tools")?,
            rendered: false,
        };
        let body = text[body_start..].trim().to_owned();
        Ok(Self {
            skill: Skill {
                rendered: renders(&body),
                ..skill
            },
            body,
        })
    }

    /// Reads and parses the `SKILL.md` of the skill folder `dir` through `sandbox`.
    pub(crate) fn read(sandbox: &Sandbox, dir: &Path, by: &str) -> Result<Self, BundleError> {
        let path = dir.join(SKILL_FILE);
        let (file, text) = sandbox.read_text(&path.display().to_string(), by)?;
        Self::parse(&file, &text)
    }
}

/// What is wrong with a skill's `name`, if anything.
fn name_problem(name: &str) -> Option<String> {
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Some(format!(
            "The skill name `{name}` is {chars} characters long, over the limit of \
             {MAX_NAME_CHARS}"
        ));
    }
    let allowed = name
        .chars()
        .all(|c| c == '-' || (c.is_alphanumeric() && !c.is_uppercase()));
    if !allowed || name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Some(format!(
            "The skill name `{name}` is not allowed: use lowercase letters, digits and \
             hyphens, with no hyphen at the start or end and never two in a row (e.g. \
             `pdf-processing`)"
        ));
    }
    None
}

/// A skill left out of the set, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkillNote {
    /// Its `SKILL.md` is malformed or could not be read.
    Skipped {
        /// The skill's folder.
        dir: PathBuf,
        /// What is wrong with it.
        error: BundleError,
    },
    /// Another skill of the same name was found first.
    Shadowed {
        /// The skill's name.
        name: String,
        /// The folder of the skill that is used.
        used: PathBuf,
        /// The folder of the one left out.
        shadowed: PathBuf,
    },
}

impl std::fmt::Display for SkillNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Skipped { error, .. } => write!(f, "Skipped a skill: {error}"),
            Self::Shadowed {
                name,
                used,
                shadowed,
            } => write!(
                f,
                "Two skills are named `{name}`: using `{}`, not `{}`",
                used.display(),
                shadowed.display()
            ),
        }
    }
}

/// The skills an agent may load, by name, and what discovery left out.
#[derive(Debug, Clone, Default)]
pub struct SkillSet {
    skills: BTreeMap<String, Skill>,
    notes: Vec<SkillNote>,
    folders: Vec<PathBuf>,
}

impl SkillSet {
    /// No skills.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The skills in `folders`, in order (first found wins), each `SKILL.md` read through
    /// `sandbox` (recorded as read `by`). A folder is either one skill (it holds
    /// `SKILL.md`) or a folder of skills (its sub-folders that hold one); folders that do not
    /// exist are passed over. `known` skills (already read, e.g. the agent's own) come first
    /// and are not read again.
    pub(crate) fn discover(
        folders: &[PathBuf],
        known: &[Skill],
        sandbox: &Sandbox,
        by: &str,
    ) -> Self {
        let mut set = Self {
            folders: folders.to_vec(),
            ..Self::new()
        };
        for skill in known {
            set.add(skill.clone());
        }
        for folder in folders {
            for dir in skill_dirs(folder) {
                let Ok(dir) = std::fs::canonicalize(&dir) else {
                    continue;
                };
                if set.skills.values().any(|s| s.dir == dir) {
                    continue;
                }
                match SkillFile::read(sandbox, &dir, by) {
                    Ok(file) => set.add(file.skill),
                    Err(error) => set.notes.push(SkillNote::Skipped { dir, error }),
                }
            }
        }
        set
    }

    fn add(&mut self, skill: Skill) {
        match self.skills.get(&skill.name) {
            Some(used) => self.notes.push(SkillNote::Shadowed {
                name: skill.name.clone(),
                used: used.dir.clone(),
                shadowed: skill.dir,
            }),
            None => {
                self.skills.insert(skill.name.clone(), skill);
            }
        }
    }

    /// The skill named `name`.
    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.get(name)
    }

    /// Why the skill in a folder named `name` was left out, when its `SKILL.md` was
    /// malformed or could not be read (and no other skill has that name).
    pub(crate) fn skipped(&self, name: &str) -> Option<&BundleError> {
        if self.skills.contains_key(name) {
            return None;
        }
        self.notes.iter().find_map(|note| match note {
            SkillNote::Skipped { dir, error } if dir.file_name().is_some_and(|n| n == name) => {
                Some(error)
            }
            _ => None,
        })
    }

    /// The names of the skills, then those of the folders left out as malformed (which
    /// `load_skill` answers with what is wrong), sorted, each once.
    pub(crate) fn loadable_names(&self) -> Vec<String> {
        let mut names = self.names();
        names.extend(self.notes.iter().filter_map(|note| match note {
            SkillNote::Skipped { dir, .. } => Some(dir.file_name()?.to_string_lossy().into_owned()),
            SkillNote::Shadowed { .. } => None,
        }));
        names.sort();
        names.dedup();
        names
    }

    /// Every skill, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Skill> {
        self.skills.values()
    }

    /// The names of the skills, sorted.
    pub fn names(&self) -> Vec<String> {
        self.skills.keys().cloned().collect()
    }

    /// How many skills there are.
    pub fn len(&self) -> usize {
        self.skills.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// The skill whose folder holds `path` (canonical), if any.
    pub(crate) fn containing(&self, path: &Path) -> Option<&Skill> {
        self.skills.values().find(|s| path.starts_with(&s.dir))
    }

    /// The folders searched, in order.
    pub(crate) fn folders(&self) -> &[PathBuf] {
        &self.folders
    }

    /// Skills left out, and names found twice.
    pub fn notes(&self) -> &[SkillNote] {
        &self.notes
    }
}

/// The skill folders of the project at `project`: those of [`PROJECT_SKILL_FOLDERS`] that
/// exist there.
pub(crate) fn project_skill_folders(project: &Path) -> Vec<PathBuf> {
    PROJECT_SKILL_FOLDERS
        .iter()
        .map(|rel| project.join(rel))
        .filter(|path| path.is_dir())
        .collect()
}

/// The skill folders in `folder`: itself when it holds `SKILL.md`, else its sub-folders that
/// do (sorted by name; links to folders are followed here and checked by the sandbox when
/// read).
pub(crate) fn skill_dirs(folder: &Path) -> Vec<PathBuf> {
    if folder.join(SKILL_FILE).is_file() {
        return vec![folder.to_owned()];
    }
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .take(MAX_FOLDER_ENTRIES)
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                && path.join(SKILL_FILE).is_file()
        })
        .collect();
    dirs.sort();
    dirs
}

/// Whether `path` is a skill folder (it holds a `SKILL.md`).
pub(crate) fn is_skill_dir(path: &Path) -> bool {
    path.is_dir() && path.join(SKILL_FILE).is_file()
}

/// The error for a skill name that names no skill of `skills`: what is wrong with its
/// `SKILL.md` when it was left out as malformed, else that there is none.
pub(crate) fn no_skill(name: &str, skills: &SkillSet) -> BundleError {
    skills
        .skipped(name)
        .cloned()
        .unwrap_or_else(|| BundleError::NoSkill {
            name: name.to_owned(),
            available: skills.names(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(folder: &str, text: &str) -> Result<SkillFile, BundleError> {
        SkillFile::parse(&Path::new("/s").join(folder).join(SKILL_FILE), text)
    }

    #[test]
    fn a_skill_file_splits_into_front_matter_and_instructions() {
        let file = parse(
            "pdf-tools",
            "---\nname: pdf-tools\ndescription: 'Read PDFs: text and tables.'\nlicense: MIT\nmetadata:\n  version: 1.0\nargument-hint: ignored\n---\n\n# PDF\n\nUse `scripts/x.py`.\n",
        )
        .expect("parses");
        assert_eq!(file.skill.name, "pdf-tools");
        assert_eq!(file.skill.description, "Read PDFs: text and tables.");
        assert_eq!(file.skill.license.as_deref(), Some("MIT"));
        assert_eq!(file.skill.metadata["version"], "1.0");
        assert_eq!(file.skill.dir, Path::new("/s/pdf-tools"));
        assert_eq!(file.body, "# PDF\n\nUse `scripts/x.py`.");
    }

    #[test]
    fn every_folder_bmads_installer_writes_skills_to_is_searched() {
        let project = tempfile::tempdir().expect("tempdir");
        // A sample of BMAD's `target_dir`s, the newest last.
        for rel in [
            ".agents/skills",
            ".claude/skills",
            ".cursor/skills",
            ".kimi/skills",
        ] {
            std::fs::create_dir_all(project.path().join(rel)).expect("mkdir");
        }
        std::fs::create_dir_all(project.path().join(".unknown/skills")).expect("mkdir");
        let found: Vec<PathBuf> = project_skill_folders(project.path())
            .iter()
            .map(|f| f.strip_prefix(project.path()).expect("inside").to_owned())
            .collect();
        assert_eq!(
            found,
            [
                ".agents/skills",
                ".claude/skills",
                ".cursor/skills",
                ".kimi/skills"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn malformed_skill_files_name_the_line_and_the_problem() {
        let cases = [
            (
                "# no front matter\n",
                "line 1: A `SKILL.md` starts with YAML front matter",
            ),
            ("---\nname: x\n", "line 1: The front matter is never closed"),
            (
                "---\nname: x\ndescription: Use when: the user asks\n---\n",
                "line 3: The front matter is not valid YAML: mapping values are not allowed in this context (a value holding `: ` must be quoted)",
            ),
            (
                "---\ndescription: d\n---\n",
                "line 2: The front matter has no `name`; add `name: x`",
            ),
            (
                "---\nname: X\ndescription: d\n---\n",
                "line 2: The skill name `X` is not allowed",
            ),
            (
                "---\nname: a--b\ndescription: d\n---\n",
                "line 2: The skill name `a--b` is not allowed",
            ),
            (
                "---\nname: -x\ndescription: d\n---\n",
                "line 2: The skill name `-x` is not allowed",
            ),
            (
                "---\nname: y\ndescription: d\n---\n",
                "line 2: The skill is named `y` but its folder is `x`",
            ),
            (
                "---\nname: x\n---\n",
                "line 2: The front matter has no `description`",
            ),
            (
                "---\nname: x\ndescription: ''\n---\n",
                "line 2: The front matter has no `description`",
            ),
            (
                "---\nname: x\ndescription: [a]\n---\n",
                "line 3: `description` must be text",
            ),
            (
                "---\nname: x\ndescription: d\nmetadata: [1]\n---\n",
                "line 4: `metadata` must map names to text",
            ),
        ];
        for (text, expected) in cases {
            let err = parse("x", text).expect_err(text).to_string();
            assert!(
                err.starts_with(&format!("`/s/x/SKILL.md` {expected}")),
                "{text:?}: {err}"
            );
        }
        let long = format!("---\nname: x\ndescription: {}\n---\n", "d".repeat(1025));
        let err = parse("x", &long).expect_err("too long").to_string();
        assert!(
            err.contains("line 3: The `description` is 1025 characters long"),
            "{err}"
        );
        let long = "a".repeat(65);
        let err = parse(&long, &format!("---\nname: {long}\ndescription: d\n---\n"))
            .expect_err("too long")
            .to_string();
        assert!(
            err.contains("is 65 characters long, over the limit of 64"),
            "{err}"
        );
    }
}
