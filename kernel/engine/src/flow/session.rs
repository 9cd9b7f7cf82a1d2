//! The session store: state that outlives one invocation.
//!
//! A [`SessionKey`] names an app, a user and a session. Loading merges the `app:` keys of the
//! app, the `user:` keys of the user (within the app) and the unprefixed keys of the session;
//! saving splits a final state the same way and drops `temp:` keys. [`FileSessionStore`],
//! the embedded default, keeps one JSON file per scope under a root folder:
//!
//! ```text
//! ROOT/<app>/app.json                       app: keys
//! ROOT/<app>/users/<user>/user.json         user: keys
//! ROOT/<app>/users/<user>/<session>.json    session keys
//! ```
//!
//! Each file is written to a temporary file and renamed into place, so a crash leaves the
//! old file or the new one, never half of one.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::state::{Scope, State};

/// Whose state to load or save.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// The application (a workflow's name).
    pub app: String,
    /// The user.
    pub user: String,
    /// The session.
    pub session: String,
}

/// Why the store could not load or save.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A name cannot be used as a file name.
    #[error(
        "The {what} name `{name}` cannot name a stored session; use letters, digits, `-`, `_` \
         and `.` (not starting with `.`)"
    )]
    BadName {
        /// `app`, `user` or `session`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A file could not be read or written.
    #[error("Cannot {action} `{path}`: {detail}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's message.
        detail: String,
    },
    /// A file holds something other than a JSON object.
    #[error("`{path}` is not a JSON object of state values ({detail}); fix or delete it")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        detail: String,
    },
}

/// Where `user:`, `app:` and session keys persist between invocations.
pub trait SessionStore: Send + Sync {
    /// The stored state of `key` (empty if nothing is stored yet).
    fn load(&self, key: &SessionKey) -> Result<State, StoreError>;

    /// Stores `state` for `key` (its `temp:` keys are dropped).
    fn save(&self, key: &SessionKey, state: &State) -> Result<(), StoreError>;
}

/// A [`SessionStore`] of JSON files under a root folder.
#[derive(Debug, Clone)]
pub struct FileSessionStore {
    root: PathBuf,
}

impl FileSessionStore {
    /// A store under `root` (created on the first save).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn paths(&self, key: &SessionKey) -> Result<[(Scope, PathBuf); 3], StoreError> {
        let app = self.root.join(checked("app", &key.app)?);
        let user = app.join("users").join(checked("user", &key.user)?);
        let session = user.join(format!("{}.json", checked("session", &key.session)?));
        Ok([
            (Scope::App, app.join("app.json")),
            (Scope::User, user.join("user.json")),
            (Scope::Session, session),
        ])
    }
}

fn checked<'a>(what: &'static str, name: &'a str) -> Result<&'a str, StoreError> {
    let fine = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if fine {
        Ok(name)
    } else {
        Err(StoreError::BadName {
            what,
            name: name.to_owned(),
        })
    }
}

fn read_map(path: &Path) -> Result<Map<String, Value>, StoreError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => {
            return Err(StoreError::Io {
                action: "read",
                path: path.to_owned(),
                detail: e.to_string(),
            });
        }
    };
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

fn write_map(path: &Path, map: &Map<String, Value>) -> Result<(), StoreError> {
    let io = |e: std::io::Error| StoreError::Io {
        action: "write",
        path: path.to_owned(),
        detail: e.to_string(),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = serde_json::to_vec_pretty(map).map_err(|e| io(e.into()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

impl SessionStore for FileSessionStore {
    fn load(&self, key: &SessionKey) -> Result<State, StoreError> {
        let mut values = Map::new();
        for (scope, path) in self.paths(key)? {
            // Only the keys of the file's own scope count, whatever else was put there.
            values.extend(
                read_map(&path)?
                    .into_iter()
                    .filter(|(k, _)| Scope::of(k) == scope),
            );
        }
        Ok(State::from_map(values))
    }

    fn save(&self, key: &SessionKey, state: &State) -> Result<(), StoreError> {
        for (scope, path) in self.paths(key)? {
            let part: Map<String, Value> = state
                .values()
                .iter()
                .filter(|(k, _)| Scope::of(k) == scope)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            write_map(&path, &part)?;
        }
        Ok(())
    }
}
