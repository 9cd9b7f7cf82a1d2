//! Keys out of the model's reach: the process-level step of `rlm run`, `rlm chat` and `rlm demo`.
//!
//! The model's code runs in this process's embedded interpreter, and a context can carry a
//! prompt injection ("print the environment"). So before anything starts a thread or
//! Python, [`protect`]:
//!
//! 1. reads every key variable through [`bridge::secret::env_secret`]: `OPENAI_API_KEY`,
//!    `ANTHROPIC_API_KEY`, `RLM_MOCK_API_KEY`, the `--api-key-env` variable (flag,
//!    `RLM_API_KEY_ENV` or `rlm.toml`) and every other variable whose name ends in `_API_KEY`.
//!    The bridge keeps the values (endpoints built later and retries still authenticate) and
//!    redacts them from everything the process writes;
//! 2. registers the values of the `--secret NAME` variables for redaction; those stay in the
//!    environment (the code may need them), but no output shows them;
//! 3. removes the key variables from the environment, so `os.environ` (built when Python
//!    starts) and child processes (`subprocess`, `os.system`) never see them;
//! 4. on Linux, blanks their entries (`NAME=value`, every byte set to NUL) in the initial
//!    environment block, which `/proc/self/environ` shows and which removing a variable
//!    leaves untouched, then reads `/proc/self/environ` back and fails the run if one of them
//!    still shows a value.
//!
//! Why overwrite the block in place rather than re-exec with a cleaned environment: a
//! re-exec must hand the keys to the new image some other way (a pipe or an inherited file
//! descriptor, a protocol of its own), starts the process twice and changes what a parent
//! waiting on the first process sees; the overwrite is a few bytes in memory the process owns
//! (the top of the main thread's stack, at the addresses the kernel reports in
//! `/proc/self/stat`), done while the process is still single-threaded, and checked
//! afterwards. On other systems the variables are removed; there is no `/proc` to blank.
//!
//! What this does not do (see the threat model in `kernel/cli/docs/security.md`): the keys
//! stay in this process's memory, which code in the same process can read; files and other
//! processes of the user stay readable. A host that runs the kernel in its own interpreter (the Python package)
//! keeps its environment; only redaction applies there.

use std::borrow::Cow;

use anyhow::{Context, Result, bail};
use kernel::options::{RunOptions, Spelling};

use crate::settings::option_error;

/// Key variables read and removed whatever the configuration says.
const KEY_VARIABLES: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "RLM_MOCK_API_KEY"];

/// Every other variable whose name ends with this is a key too.
const KEY_SUFFIX: &str = "_API_KEY";

/// Reads the run's keys and `--secret` values into the bridge, then removes the keys from
/// the process environment (see the module docs). Call it before any thread or Python starts.
pub(crate) fn protect(opts: &RunOptions) -> Result<()> {
    let mut names: Vec<String> = KEY_VARIABLES.iter().map(|&n| n.to_owned()).collect();
    // A variable name the schema checked (not empty, no `=` or NUL).
    if let Some(var) = &opts.api_key_env {
        names.push(var.clone());
    }
    names.extend(
        std::env::vars_os()
            .filter_map(|(name, _)| name.into_string().ok())
            .filter(|name| name.ends_with(KEY_SUFFIX)),
    );
    names.sort();
    names.dedup();
    for name in &names {
        // Held (and redacted) by the bridge from now on.
        bridge::secret::env_secret(name);
    }
    opts.register_secrets(Spelling::Flag)
        .map_err(option_error)?;
    remove_from_environment(&names)
}

/// `text` with every secret the process knows replaced by `[redacted]`.
pub(crate) fn redact(text: &str) -> Cow<'_, str> {
    bridge::secret::redactor().redact(text)
}

/// Removes `names` from the environment and, on Linux, from the initial environment block.
fn remove_from_environment(names: &[String]) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        let threads = std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count);
        if threads > 1 {
            bail!(
                "Internal error: API keys must leave the environment before any thread starts, \
                 but {threads} threads run; please report this bug"
            );
        }
    }
    for name in names {
        if std::env::var_os(name).is_some() {
            // SAFETY: the process is still single-threaded (checked above on Linux; `protect`
            // runs first thing in `rlm run`, `rlm chat` and `rlm demo`), so nothing reads or
            // writes the environment concurrently; the schema's check of `--api-key-env` or
            // the environment itself vouches for the name.
            unsafe { std::env::remove_var(name) };
        }
    }
    #[cfg(target_os = "linux")]
    blank_initial_environment(names)?;
    Ok(())
}

/// Sets every byte of the `NAME=value` entries of `names` in the initial environment block
/// (what `/proc/self/environ` shows) to NUL, then checks that none of them shows a value
/// there any more.
#[cfg(target_os = "linux")]
fn blank_initial_environment(names: &[String]) -> Result<()> {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        // No /proc: nothing shows the block.
        return Ok(());
    };
    let (start, end) = environment_bounds(&stat)
        .context("Could not find the environment block in `/proc/self/stat`")?;
    if end > start {
        // SAFETY: `[start, end)` is this process's initial environment block, as the kernel
        // reports it: strings the kernel copied to the top of the main thread's stack at
        // exec, mapped read-write for the life of the process. Nothing else refers to the
        // entries blanked here: `remove_var` has taken them out of `environ`, and no other
        // thread runs (checked by the caller). Bytes are only overwritten, never moved.
        let block = unsafe {
            std::slice::from_raw_parts_mut(
                std::ptr::with_exposed_provenance_mut::<u8>(start),
                end - start,
            )
        };
        for entry in block.split_mut(|&b| b == 0) {
            if names.iter().any(|name| is_entry_of(entry, name)) {
                entry.fill(0);
            }
        }
    }
    let shown =
        std::fs::read("/proc/self/environ").context("Could not read `/proc/self/environ` back")?;
    if let Some(name) = names.iter().find(|name| {
        shown
            .split(|&b| b == 0)
            .any(|entry| is_entry_of(entry, name) && entry.len() > name.len() + 1)
    }) {
        bail!(
            "Could not remove `{name}` from `/proc/self/environ`; refusing to run model code \
             that could read the key"
        );
    }
    Ok(())
}

/// `env_start` and `env_end` (fields 50 and 51) of `/proc/self/stat`.
#[cfg(target_os = "linux")]
fn environment_bounds(stat: &str) -> Option<(usize, usize)> {
    // Field 2, the command name, is parenthesised and may hold spaces: count after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(50 - 3);
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    Some((start, end))
}

/// Whether `entry` is `NAME=…` for `name`.
#[cfg(target_os = "linux")]
fn is_entry_of(entry: &[u8], name: &str) -> bool {
    entry
        .strip_prefix(name.as_bytes())
        .is_some_and(|rest| rest.first() == Some(&b'='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn finds_the_environment_bounds_past_a_command_name_with_spaces() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[50 - 3] = "140737488350000".into();
        fields[51 - 3] = "140737488351000".into();
        let stat = format!("4242 (rlm (x) y) {}", fields.join(" "));
        assert_eq!(
            environment_bounds(&stat),
            Some((140_737_488_350_000, 140_737_488_351_000))
        );
        assert_eq!(environment_bounds("4242 (rlm) S 1 2"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_entry_matches_its_exact_name_only() {
        assert!(is_entry_of(b"OPENAI_API_KEY=sk-1", "OPENAI_API_KEY"));
        assert!(is_entry_of(b"OPENAI_API_KEY=", "OPENAI_API_KEY"));
        assert!(!is_entry_of(b"OPENAI_API_KEY_2=sk-1", "OPENAI_API_KEY"));
        assert!(!is_entry_of(b"X_OPENAI_API_KEY=sk-1", "OPENAI_API_KEY"));
        assert!(!is_entry_of(b"OPENAI_API_KEY", "OPENAI_API_KEY"));
    }
}
