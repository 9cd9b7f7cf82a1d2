//! Secrets: API keys and other values that no output may show.
//!
//! - [`Secret`] holds one value; its `Debug` and `Display` print `[redacted]`, so a key inside
//!   a configuration or an error never reaches a log by accident. [`Secret::expose`] is the one
//!   way to the value (the clients call it to build their auth header).
//! - [`Redactor`] replaces every known value in a text with [`REDACTED`], in its plain form
//!   and as it looks inside a JSON string, so serialized output (a trajectory line, `--json`)
//!   is covered too. Values shorter than [`MIN_REDACTED_CHARS`] are not redacted: a key such
//!   as `EMPTY` or `x` (what local servers accept) would garble ordinary text.
//! - The process's secrets: [`env_secret`] reads a key variable once and keeps its value, so
//!   an endpoint built later (or a retry) still has the key after the variable was removed
//!   from the environment; [`register`] adds a value to redact; [`redactor`] redacts
//!   everything this process knows. Clients register their keys when they are built, so
//!   whatever authenticates a call is also kept out of what the process writes.
//!
//! Keeping keys away from code is a process-level step and not done here: the `rlm` binary
//! reads its key variables through [`env_secret`] and then removes them from its environment
//! before Python starts. A host that embeds the kernel in its own interpreter (the Python
//! package) keeps its environment; there only redaction applies.
//!
//! ```
//! use bridge::{Redactor, Secret};
//!
//! let key = Secret::new("sk-test-0123456789");
//! assert_eq!(format!("{key:?} {key}"), "[redacted] [redacted]");
//! let redactor = Redactor::new([key.expose()]);
//! assert_eq!(redactor.redact("key=sk-test-0123456789"), "key=[redacted]");
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use serde::{Deserialize, Deserializer};

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Values with fewer characters are not redacted (they would garble ordinary text).
pub const MIN_REDACTED_CHARS: usize = 8;

/// A value no output may show: `Debug` and `Display` print `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(Arc::from(value.into()))
    }

    /// The value itself; only for where it must go (an auth header).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether [`Redactor`] redacts the value (it has at least [`MIN_REDACTED_CHARS`] characters).
    pub fn is_redactable(&self) -> bool {
        self.0.chars().nth(MIN_REDACTED_CHARS - 1).is_some()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::new)
    }
}

/// Replaces known secret values in text with [`REDACTED`]. Cheap to clone.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The forms searched for, longest first (so a value containing another is replaced whole).
    needles: Arc<[String]>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("forms", &self.needles.len())
            .finish()
    }
}

impl Redactor {
    /// A redactor of `values` (those under [`MIN_REDACTED_CHARS`] characters are skipped).
    pub fn new<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Self {
        let mut needles: Vec<String> = Vec::new();
        for value in values {
            let value = value.as_ref();
            if value.chars().nth(MIN_REDACTED_CHARS - 1).is_none() {
                continue;
            }
            needles.push(value.to_owned());
            // The form inside a JSON string (quotes, backslashes, control characters escaped).
            if let Ok(quoted) = serde_json::to_string(value) {
                let escaped = &quoted[1..quoted.len() - 1];
                if escaped != value {
                    needles.push(escaped.to_owned());
                }
            }
        }
        needles.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        needles.dedup();
        Self {
            needles: needles.into(),
        }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `text` with every known value replaced by [`REDACTED`]; borrowed when there is none.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(first) = self.needles.iter().position(|n| text.contains(n.as_str())) else {
            return Cow::Borrowed(text);
        };
        let mut out = text.replace(self.needles[first].as_str(), REDACTED);
        for needle in &self.needles[first + 1..] {
            if out.contains(needle.as_str()) {
                out = out.replace(needle.as_str(), REDACTED);
            }
        }
        Cow::Owned(out)
    }

    /// Redacts `text` in place.
    pub fn redact_in_place(&self, text: &mut String) {
        if let Cow::Owned(redacted) = self.redact(text) {
            *text = redacted;
        }
    }
}

/// The secrets this process knows.
#[derive(Debug, Default)]
struct Vault {
    /// Key variables by name, as first read (or last read non-empty).
    env: HashMap<String, Secret>,
    /// Every value to redact, in registration order.
    values: Vec<Secret>,
    /// `values` as a redactor, rebuilt when one is added.
    redactor: Redactor,
}

impl Vault {
    /// The value of variable `name`: its current value if `lookup` finds one (kept from now
    /// on), else the value kept from an earlier read.
    fn env_secret(
        &mut self,
        name: &str,
        lookup: impl FnOnce(&str) -> Option<String>,
    ) -> Option<Secret> {
        match lookup(name).filter(|v| !v.is_empty()) {
            Some(value) => {
                let secret = Secret::new(value);
                self.register(&secret);
                self.env.insert(name.to_owned(), secret.clone());
                Some(secret)
            }
            None => self.env.get(name).cloned(),
        }
    }

    fn register(&mut self, secret: &Secret) {
        if !secret.is_redactable() || self.values.contains(secret) {
            return;
        }
        self.values.push(secret.clone());
        self.redactor = Redactor::new(self.values.iter().map(Secret::expose));
    }
}

static VAULT: LazyLock<RwLock<Vault>> = LazyLock::new(RwLock::default);

/// The environment variable `name` as a secret: its current value (kept from now on, and
/// redacted everywhere), or, once the variable was removed, the value kept from an earlier
/// read. `None` if it was never set (or empty).
pub fn env_secret(name: &str) -> Option<Secret> {
    VAULT
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .env_secret(name, |n| std::env::var(n).ok())
}

/// Adds `secret` to what [`redactor`] redacts.
pub fn register(secret: &Secret) {
    VAULT
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .register(secret);
}

/// A redactor of every secret this process knows so far.
pub fn redactor() -> Redactor {
    VAULT
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .redactor
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints_its_value() {
        let secret = Secret::from("sk-live-abcdefgh");
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(format!("{secret}"), "[redacted]");
        assert_eq!(secret.expose(), "sk-live-abcdefgh");
        let parsed: Secret = serde_json::from_str("\"sk-live-abcdefgh\"").expect("a string");
        assert_eq!(parsed, secret);
    }

    #[test]
    fn redacts_every_occurrence_and_leaves_other_text_alone() {
        let r = Redactor::new(["sk-live-abcdefgh"]);
        assert_eq!(
            r.redact("a sk-live-abcdefgh b sk-live-abcdefgh"),
            "a [redacted] b [redacted]"
        );
        assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)));
        let mut text = String::from("xsk-live-abcdefghx");
        r.redact_in_place(&mut text);
        assert_eq!(text, "x[redacted]x");
    }

    #[test]
    fn redacts_the_form_a_value_takes_inside_json() {
        let value = "pa\"ss\\word\n42";
        let r = Redactor::new([value]);
        let json = serde_json::json!({ "stdout": format!("got {value}") }).to_string();
        let redacted = r.redact(&json);
        assert!(!redacted.contains("ss\\\\word"), "{redacted}");
        let back: serde_json::Value = serde_json::from_str(&redacted).expect("still JSON");
        assert_eq!(back["stdout"], "got [redacted]");
    }

    #[test]
    fn a_longer_value_is_replaced_whole_before_one_it_contains() {
        let r = Redactor::new(["secret-value", "my-secret-value-2"]);
        assert_eq!(
            r.redact("my-secret-value-2 secret-value"),
            "[redacted] [redacted]"
        );
    }

    #[test]
    fn short_values_are_not_redacted() {
        let r = Redactor::new(["EMPTY", "x", ""]);
        assert!(r.is_empty());
        assert_eq!(r.redact("EMPTY x"), "EMPTY x");
        assert!(!Secret::new("1234567").is_redactable());
        assert!(Secret::new("12345678").is_redactable());
    }

    #[test]
    fn a_key_read_once_survives_the_removal_of_its_variable() {
        let mut vault = Vault::default();
        let read = vault.env_secret("TEST_API_KEY", |_| Some("sk-first-value".into()));
        assert_eq!(read.as_ref().map(Secret::expose), Some("sk-first-value"));
        // The variable is gone now: the kept value answers.
        let later = vault.env_secret("TEST_API_KEY", |_| None);
        assert_eq!(later, read);
        assert_eq!(vault.redactor.redact("sk-first-value"), "[redacted]");
        // A new value in the environment wins and is redacted too.
        let changed = vault.env_secret("TEST_API_KEY", |_| Some("sk-second-value".into()));
        assert_eq!(
            changed.map(|s| s.expose().to_owned()).as_deref(),
            Some("sk-second-value")
        );
        assert_eq!(
            vault.redactor.redact("sk-first-value sk-second-value"),
            "[redacted] [redacted]"
        );
        assert_eq!(vault.env_secret("NEVER_SET_API_KEY", |_| None), None);
        assert_eq!(
            vault.env_secret("EMPTY_API_KEY", |_| Some(String::new())),
            None
        );
    }

    #[test]
    fn registering_twice_keeps_one_value() {
        let mut vault = Vault::default();
        let secret = Secret::new("registered-twice");
        vault.register(&secret);
        vault.register(&secret);
        assert_eq!(vault.values.len(), 1);
        vault.register(&Secret::new("short"));
        assert_eq!(vault.values.len(), 1);
    }
}
