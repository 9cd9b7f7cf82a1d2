//! Durable runs of `rlm flow run` / `resume`: every run is checkpointed into the run database.
//!
//! The database is the SQLite file `.rlm/runs.db` under the working directory unless `--db`
//! (`RLM_DB`, `db` in `rlm.toml`: an option of the one schema, [`RunDb`]) names another file
//! or a PostgreSQL database by URL; each run has an id (`--run-id`, or a fresh one from the workflow's name and the
//! time) said on stderr at the start. The engine's `run_durable` writes a checkpoint after
//! every node at every depth of nested sequences, loops and graphs (and every routing
//! decision); `--keep-last N` prunes the run's older checkpoints afterwards. The run record
//! keeps the workflow (a built-in's name or the file's absolute path), the inputs, the
//! context paths, the `--bundle` and the run's settings — the endpoint settings (models,
//! URLs, wire format, the name of the key's variable, prices — never a key) and the session
//! settings (`--isolation`, `--memory-limit`, `--cell-timeout`, …) — so `rlm flow resume RUN`
//! needs only the run id and continues as the run started; a flag given to `resume`
//! overrides the stored value. A run stopped by
//! Ctrl-C is `interrupted`, and the command that continues it is printed.
//!
//! A run that a router escalates to a human stops with status `awaiting_human`: the question,
//! the decisions so far and the exact resume command are printed, and the exit code is
//! [`EXIT_AWAITING_HUMAN`]. A run id that is taken, an unknown run or checkpoint, a completed
//! run: usage errors (exit 2); a newer schema, a locked or damaged database: errors (exit 1).
//! None of them changes the database.
//!
//! One run, one writer: the engine leases the run to this process while it runs. A resume of a
//! run that another live process drives is refused before any model or Python starts, and a
//! process whose run was taken over stops at its next write — both exit
//! [`EXIT_RUN_DRIVEN`]. A dead owner's run (killed, crashed, rebooted) is taken over, said in
//! one line; in an SQLite file an owner on another host cannot be checked, so `--take-over`
//! must say so. In PostgreSQL the lease has a heartbeat and expires after `--lease-expiry`
//! seconds without one, so a run whose host disappeared is taken over by the next resume from
//! any host.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use clap::Args;
use engine::durable::{
    CheckpointId, DurableError, DurableReport, DurableRoot, LeaseHolder, Liveness, Location,
    RunRecord, RunStatus, Start, Store, StoreError, resume_point, run_durable,
};
use engine::flow::{Agent, Invocation};
use engine::reducer::DECISIONS;
use engine::route::{DecisionRecord, rfc3339};
use engine::state::State;
use kernel::options::{Group, Groups, RunOptions, Source};
use serde_json::{Value, json};

use crate::exit::{EXIT_AWAITING_HUMAN, EXIT_INTERRUPTED, EXIT_RUN_DRIVEN, UsageError};
use crate::outputs::Database;

/// Where the runs are kept unless `--db` says otherwise (under the working directory).
pub(crate) const DEFAULT_DB: &str = ".rlm/runs.db";

/// The run database (`--db`, `RLM_DB`, `db` in `rlm.toml`) and the lease on a run in it
/// (`--lease-expiry`), as a command's settings name them (the one option schema's `Database`
/// and `Lease` groups).
#[derive(Debug, Clone, Default)]
pub(crate) struct RunDb {
    /// The `--db` value, if any.
    db: Option<String>,
    /// How long a PostgreSQL lease lasts without a heartbeat, if set.
    lease_expiry: Option<Duration>,
}

impl RunDb {
    /// The run database and lease that `opts` name.
    pub(crate) fn of(opts: &RunOptions) -> Result<Self> {
        let lease_expiry = match opts.lease_expiry {
            Some(seconds) if seconds < 1.0 => {
                return Err(UsageError::new(format!(
                    "The lease expiry (`--lease-expiry`, `RLM_LEASE_EXPIRY` or `lease-expiry` in \
                     `rlm.toml`) must be at least 1 second, got {seconds}"
                ))
                .into());
            }
            seconds => seconds.map(Duration::from_secs_f64),
        };
        Ok(Self {
            db: opts.db.clone(),
            lease_expiry,
        })
    }

    /// Where the database is (a URL's password is registered for redaction here).
    pub(crate) fn location(&self) -> Result<Location> {
        let text = self.db.as_deref().unwrap_or(DEFAULT_DB);
        Location::parse(text).map_err(usage)
    }

    /// Opens the existing database only to read it (nothing is written, so a read-only file,
    /// folder or mount will do).
    pub(crate) fn open_read_only(&self) -> Result<Arc<dyn Store>> {
        wait(self.open_read_only_async())
    }

    /// [`open_read_only`](Self::open_read_only) on the caller's runtime.
    pub(crate) async fn open_read_only_async(&self) -> Result<Arc<dyn Store>> {
        let location = self.location()?;
        engine::durable::open_read_only(&location)
            .await
            .map_err(store_error)
    }

    /// ` --db …` for a command line, empty for the default (a URL without its password).
    fn flag(&self) -> String {
        match self.location() {
            Ok(location) if location != Location::Sqlite(PathBuf::from(DEFAULT_DB)) => {
                format!(" --db {}", shell_word(&location.to_string()))
            }
            _ => String::new(),
        }
    }
}

/// Opens the run database for writing: the SQLite file the output guard cleared (`db`, made
/// with its folder when missing; its pages are checked first, so a damaged or read-only file
/// is refused here, before anything is written), or the PostgreSQL database at `location`.
pub(crate) fn open_store(
    location: &Location,
    db: Option<&Database>,
    run_db: &RunDb,
) -> Result<Arc<dyn Store>> {
    let location = match (location, db) {
        (Location::Sqlite(_), Some(db)) => Location::Sqlite(db.prepare()?.to_path_buf()),
        (Location::Sqlite(path), None) => {
            anyhow::bail!(
                "The run database `{}` was not cleared for writing",
                path.display()
            )
        }
        (postgres, _) => postgres.clone(),
    };
    #[allow(clippy::disallowed_methods)] // The guard cleared `db`: this is its one opening.
    let store = wait(engine::durable::open(&location, run_db.lease_expiry)).map_err(store_error)?;
    Ok(store)
}

/// `future`'s output, on the shared runtime (for the commands' synchronous code).
pub(crate) fn wait<F: std::future::Future>(future: F) -> F::Output {
    kernel::runtime::shared().block_on(future)
}

/// `future`'s output, on a runtime of this thread that is gone when this returns (its
/// blocking threads joined): for what a command reads from the run database before the API
/// keys leave the environment, which needs a process of one thread
/// ([`crate::secrets::protect`]).
pub(crate) fn before_threads<F: std::future::Future>(future: F) -> Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("Could not start an async runtime to read the run database")?;
    let output = runtime.block_on(future);
    // Dropping it joins its threads.
    drop(runtime);
    Ok(output)
}

/// How a resumed run continues: from its head or an earlier checkpoint, with a human's
/// answer, taken over from an owner that cannot be checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Resume {
    pub(crate) from: Option<CheckpointId>,
    pub(crate) answer: Option<String>,
    pub(crate) take_over: bool,
}

/// The durable options of `rlm flow run`.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct DurableArgs {
    /// The run database, from the command's settings (`--db` is an option of the schema).
    #[arg(skip)]
    pub(crate) db: RunDb,

    /// The run's id [default: the workflow's name, the time and a random suffix].
    #[arg(long, value_name = "ID")]
    pub(crate) run_id: Option<String>,

    /// After the run, keep only its last N checkpoints (older ones are removed).
    #[arg(long, value_name = "N")]
    pub(crate) keep_last: Option<NonZeroUsize>,
}

/// A run about to start or resume, with its database.
pub(crate) struct Durable {
    store: Arc<dyn Store>,
    db: RunDb,
    run_id: String,
    start: Start,
    keep_last: Option<NonZeroUsize>,
    /// The holder a resume takes the run over from, said at the start.
    replaces: Option<LeaseHolder>,
}

impl Durable {
    /// A new run of `workflow` (as named on the command line) in `store`, from `state`,
    /// loading `contexts`, its personas from `bundle`, its models as `opts` say.
    pub(crate) fn new_run(
        store: Arc<dyn Store>,
        args: &DurableArgs,
        workflow: &str,
        state: &State,
        contexts: &[std::ffi::OsString],
        bundle: Option<&Path>,
        opts: &RunOptions,
    ) -> Result<Self> {
        let run_id = match &args.run_id {
            Some(id) => checked_id(id)?,
            None => fresh_id(workflow),
        };
        let input = json!({
            "inputs": state,
            "contexts": contexts.iter().map(|c| absolute_context(c)).collect::<Vec<_>>(),
            "bundle": bundle.map(|b| std::path::absolute(b).unwrap_or_else(|_| b.to_path_buf())),
            SETTINGS: kept_settings(opts),
        });
        if wait(store.run(&run_id)).map_err(store_error)?.is_some() {
            return Err(usage(StoreError::DuplicateRun(run_id)));
        }
        Ok(Self {
            store,
            db: args.db.clone(),
            run_id,
            start: Start::New {
                workflow: workflow_label(workflow),
                input,
            },
            keep_last: args.keep_last,
            replaces: None,
        })
    }

    /// Resuming run `args.run_id` in `store` as `resume` says.
    pub(crate) fn resume(
        store: Arc<dyn Store>,
        args: &DurableArgs,
        resume: Resume,
    ) -> Result<Self> {
        let Resume {
            from,
            answer,
            take_over,
        } = resume;
        let run_id = args
            .run_id
            .clone()
            .ok_or_else(|| UsageError::new("`rlm flow resume` needs the run's id"))?;
        // Refused before any model or Python starts; `run_durable` checks again. The lease
        // first: a run another process drives is not judged by the status it has for now.
        let replaces = wait(store.check_claim(&run_id, take_over)).map_err(store_error)?;
        wait(resume_point(
            store.as_ref(),
            &run_id,
            from,
            answer.is_some(),
        ))
        .map_err(durable_error)?;
        Ok(Self {
            store,
            db: args.db.clone(),
            run_id,
            start: Start::Resume {
                from,
                answer,
                take_over,
            },
            keep_last: args.keep_last,
            replaces,
        })
    }

    /// Says on stderr which run this is and where it is kept.
    pub(crate) fn announce(&self) {
        let verb = match self.start {
            Start::New { .. } => "run",
            Start::Resume { .. } => "resuming run",
        };
        eprintln!(
            "{verb} `{}` (checkpoints in `{}`)",
            self.run_id,
            self.store.location()
        );
        if let Some(holder) = &self.replaces {
            let why = match holder.liveness() {
                Liveness::Unchecked | Liveness::Renewed => "as `--take-over` asks",
                Liveness::Dead if holder.expired => "its lease expired without a heartbeat",
                Liveness::Alive | Liveness::Dead => "that process is gone",
            };
            eprintln!("taking the run over from {holder} ({why})");
        }
    }

    /// Runs `root` durably in `invocation`, then prunes as `--keep-last` says.
    pub(crate) async fn run(
        &self,
        root: Arc<dyn Agent>,
        invocation: Invocation,
    ) -> Result<DurableReport> {
        let root = DurableRoot::new(root)?;
        let report = run_durable(
            root.graph(),
            root.plane(),
            &self.store,
            &self.run_id,
            self.start.clone(),
            invocation,
        )
        .await
        .map_err(durable_error)?;
        if let Some(keep) = self.keep_last {
            let pruned = self
                .store
                .prune(&self.run_id, keep.get())
                .await
                .map_err(store_error)?;
            if pruned.removed > 0 {
                eprintln!(
                    "kept the last {keep} checkpoints of `{}` ({} older removed)",
                    self.run_id, pruned.removed
                );
            }
        }
        Ok(report)
    }

    /// For a run that stopped to ask a human: prints the question, the decisions so far and
    /// the resume command (on stderr with `--json`, else stdout) and gives the exit code. For
    /// a run stopped by Ctrl-C: says on stderr how to continue it and gives the exit code.
    pub(crate) fn conclude(&self, report: &DurableReport, json: bool) -> Option<ExitCode> {
        match &report.status {
            RunStatus::AwaitingHuman { question } => {
                let decisions = decisions_of(&report.run.state);
                let text = awaiting_text(&self.run_id, question, &decisions, &self.db);
                if json {
                    eprint!("{text}");
                } else {
                    print!("{text}");
                }
                Some(ExitCode::from(EXIT_AWAITING_HUMAN))
            }
            RunStatus::Interrupted => {
                eprintln!(
                    "Run `{}` was interrupted; its state and checkpoints are kept. Continue \
                     it with:\n  rlm flow resume {}{}",
                    self.run_id,
                    shell_word(&self.run_id),
                    self.db.flag()
                );
                Some(ExitCode::from(EXIT_INTERRUPTED))
            }
            _ => None,
        }
    }
}

/// The key of the run record's input that holds the run's settings.
const SETTINGS: &str = "settings";

/// The groups of the schema whose options the run record keeps: which models a run talks to
/// and how ([`Group::Models`]: the models, their URLs and wire format, the variable holding
/// the key, `--secret` variable names, sampling, prices) and where and how its code runs
/// ([`Group::Session`]: `--isolation`, `--memory-limit`, `--on-crash`, the cell time limit,
/// sub-calls from code). A resumed run keeps its confinement: one started `--isolation
/// strict` is not resumed less confined.
const KEPT: Groups = Group::Models.bit() | Group::Session.bit();

/// The options of `opts` of the [`KEPT`] groups, by name as the schema gives them, for the
/// run record: `resume` uses them unless its own flags say otherwise. Never a key: only the
/// variable's name is an option, and a value holding a known secret (a key in a URL) is left
/// out, so `resume` asks for it rather than call a broken URL.
fn kept_settings(opts: &RunOptions) -> Value {
    let holds_secret = |value: &Value| match value {
        Value::String(text) => crate::secrets::redact(text) != text.as_str(),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .any(|text| crate::secrets::redact(text) != text),
        _ => false,
    };
    let mut settings = opts.clone().only(KEPT).to_map();
    settings.retain(|_, value| !holds_secret(value));
    Value::Object(settings)
}

/// The settings a run record keeps (none for a run recorded before they were).
pub(crate) fn stored_settings(run: &RunRecord) -> Result<RunOptions> {
    match run.input.get(SETTINGS) {
        None | Some(Value::Null) => Ok(RunOptions::default()),
        Some(Value::Object(settings)) => RunOptions::from_json(&Source::Keyword, settings)
            .map(|kept| kept.only(KEPT))
            .map_err(|e| {
                anyhow::anyhow!(
                    "Run `{}` keeps settings this version cannot read ({e}); pass the model \
                 and session flags to `rlm flow resume`",
                    run.run_id
                )
            }),
        Some(other) => Err(anyhow::anyhow!(
            "Run `{}` keeps settings this version cannot read (`{other}` is not an \
             object); pass the model and session flags to `rlm flow resume`",
            run.run_id
        )),
    }
}

/// What a run waiting for a human shows.
pub(crate) fn awaiting_text(
    run_id: &str,
    question: &str,
    decisions: &[DecisionRecord],
    db: &RunDb,
) -> String {
    let mut text = format!("\nRun `{run_id}` is waiting for a human.\nQuestion: {question}\n");
    if !decisions.is_empty() {
        text.push_str("\nDecisions so far:\n");
        text.push_str(&decision_lines(decisions));
    }
    text.push_str(&format!(
        "\nAnswer and continue:\n  rlm flow resume {}{} --input \"<your answer>\"\n",
        shell_word(run_id),
        db.flag()
    ));
    text
}

/// The decision records in `state`'s `decisions` channel (entries that are not records are
/// skipped: the channel is the router's own).
pub(crate) fn decisions_of(state: &State) -> Vec<DecisionRecord> {
    state
        .get(DECISIONS)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| serde_json::from_value(item.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Decisions as numbered lines: summary, then the rationale and artifacts indented.
pub(crate) fn decision_lines(decisions: &[DecisionRecord]) -> String {
    let mut text = String::new();
    for (i, d) in decisions.iter().enumerate() {
        text.push_str(&format!(
            "{:>3}. {}  {}: {}\n       why: {}\n",
            i + 1,
            d.timestamp,
            d.agent,
            d.summary,
            d.rationale
        ));
        if !d.related_artifacts.is_empty() {
            text.push_str(&format!(
                "       artifacts: {}\n",
                d.related_artifacts.join(", ")
            ));
        }
    }
    text
}

/// Unix milliseconds as RFC 3339 (UTC).
pub(crate) fn time_of(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    rfc3339(UNIX_EPOCH + Duration::from_millis(ms))
}

/// A store error for the user: their mistakes are usage errors (exit 2), the rest exit 1
/// except a run another process drives ([`exit_code`]).
pub(crate) fn store_error(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::UnknownRun(_)
        | StoreError::Missing { .. }
        | StoreError::DuplicateRun(_)
        | StoreError::UnknownCheckpoint(_)
        | StoreError::WrongRun { .. } => usage(e),
        other => other.into(),
    }
}

/// The exit code of `err` when it is a run another process drives: [`EXIT_RUN_DRIVEN`].
pub(crate) fn exit_code(err: &anyhow::Error) -> Option<u8> {
    match err.downcast_ref::<StoreError>()? {
        StoreError::Driven { .. }
        | StoreError::DrivenElsewhere { .. }
        | StoreError::Renewed { .. }
        | StoreError::LeaseLost { .. }
        | StoreError::LeaseExpired { .. } => Some(EXIT_RUN_DRIVEN),
        _ => None,
    }
}

fn durable_error(e: DurableError) -> anyhow::Error {
    match e {
        DurableError::Store(e) => store_error(e),
        other => usage(other),
    }
}

fn usage(e: impl std::fmt::Display) -> anyhow::Error {
    UsageError::new(e.to_string()).into()
}

/// `id` when it is usable as a run id (it goes into shell commands and file listings).
fn checked_id(id: &str) -> Result<String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(id.to_owned())
    } else {
        Err(UsageError::new(format!(
            "`--run-id {id}` is not a run id: use letters, digits, `-`, `_` and `.` (at most 128)"
        ))
        .into())
    }
}

/// `NAME-YYYYMMDD-HHMMSS-XXXX` from the workflow's name, the time (UTC) and 16 random bits.
pub(crate) fn fresh_id(workflow: &str) -> String {
    let stem = Path::new(workflow)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let stem = if stem.trim_matches('-').is_empty() {
        "run".to_owned()
    } else {
        stem
    };
    let digits: String = rfc3339(SystemTime::now())
        .chars()
        .filter(char::is_ascii_digit)
        .take(14)
        .collect();
    let (date, time) = digits.split_at(digits.len().min(8));
    format!("{stem}-{date}-{time}-{:04x}", rand::random::<u16>())
}

/// A workflow file as its absolute path, a built-in's name as it is.
fn workflow_label(workflow: &str) -> String {
    let path = Path::new(workflow);
    if path.exists() {
        std::path::absolute(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string()
    } else {
        workflow.to_owned()
    }
}

/// A `--context [NAME=]PATH` with its path made absolute, so a resume finds it from anywhere.
fn absolute_context(arg: &std::ffi::OsStr) -> String {
    let text = arg.to_string_lossy();
    let absolute = |p: &str| {
        std::path::absolute(p)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| p.to_owned())
    };
    if Path::new(text.as_ref()).exists() {
        return absolute(&text);
    }
    match text.split_once('=') {
        Some((name, path)) if Path::new(path).exists() => format!("{name}={}", absolute(path)),
        _ => text.into_owned(),
    }
}

/// `word` quoted for a POSIX shell when it needs it.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run record holding `settings` as its endpoint settings.
    fn record(settings: Value) -> RunRecord {
        RunRecord {
            run_id: "r".into(),
            workflow: "team".into(),
            status: RunStatus::Running,
            input: json!({ "inputs": {}, SETTINGS: settings }),
            head: None,
            checkpoints: 0,
            created_ms: 0,
            updated_ms: 0,
            lease: None,
        }
    }

    /// Every option of the schema's model and session groups, from its example, is kept in
    /// the run record and read back unchanged; no other option is kept (issue 23 §4; the
    /// session's, e.g. `--isolation`, so that a resumed run runs its code as it started).
    #[test]
    fn the_model_and_session_options_and_only_they_round_trip_through_the_run_record() {
        for spec in kernel::options::OPTIONS {
            let given =
                RunOptions::from_text(&Source::Flag, [(spec.name, vec![spec.example.to_owned()])])
                    .unwrap_or_default();
            assert_ne!(given, RunOptions::default(), "{}", spec.name);
            // Stored as JSON text and read back, as the store does.
            let text = kept_settings(&given).to_string();
            let kept = stored_settings(&record(serde_json::from_str(&text).unwrap_or_default()))
                .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
            if matches!(spec.group, Group::Models | Group::Session) {
                assert_eq!(kept, given, "{}", spec.name);
            } else {
                assert_eq!(kept, RunOptions::default(), "{} kept", spec.name);
            }
        }
    }

    /// A value holding a known secret (a key in a URL) is left out, not kept redacted; a run
    /// recorded before settings were kept has none; a record that is not readable says what
    /// to do.
    #[test]
    fn a_value_holding_a_secret_is_not_kept() {
        bridge::secret::register(&bridge::secret::Secret::new("sk-unit-9f3e2a7c"));
        let given = RunOptions {
            model: Some("m".into()),
            base_url: Some("http://127.0.0.1:9/v1?key=sk-unit-9f3e2a7c".into()),
            ..RunOptions::default()
        };
        let settings = kept_settings(&given);
        assert_eq!(settings, json!({ "model": "m" }));
        let mut old = record(Value::Null);
        old.input = json!({ "inputs": {} });
        assert_eq!(stored_settings(&old).ok(), Some(RunOptions::default()));
        let bad = stored_settings(&record(json!({ "model": 7 })));
        let message = bad.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("pass the model and session flags to `rlm flow resume`"),
            "{message}"
        );
    }

    #[test]
    fn fresh_ids_are_readable_and_accepted_as_run_ids() {
        let id = fresh_id("/some/where/team.yaml");
        assert!(id.starts_with("team-"), "{id}");
        assert_eq!(id.len(), "team-20261126-153512-abcd".len(), "{id}");
        assert_eq!(checked_id(&id).ok(), Some(id));
        assert!(checked_id("two words").is_err());
        assert!(checked_id("").is_err());
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("runs/a.db"), "runs/a.db");
        assert_eq!(shell_word("my runs.db"), "'my runs.db'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
