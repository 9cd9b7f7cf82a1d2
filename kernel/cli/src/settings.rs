//! The settings of a command: the run options of the kernel's one schema
//! (`kernel::options`), as flags, over the environment and `rlm.toml`.
//!
//! [`RunFlags`] is the clap argument group of a command's options: one flag per entry of
//! `kernel::options::OPTIONS` in the [`Groups`] the command offers (its const parameter; see
//! [`offers`]), built from the schema at run time — its name (`--max-iterations`), value name,
//! help, environment variable and the values it takes. Nothing here lists options: a new
//! one in the schema is a new flag of every command that offers its group. The kernel reads
//! the environment and the file ([`RunOptions::layered`]); a command keeps only its groups
//! of them, so one `rlm.toml` serves every command. Precedence: flag > environment >
//! `rlm.toml` > built-in default.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches};
use kernel::options::{Choice, Groups, Kind, OPTIONS, OptionError, OptionSpec, RunOptions, Source};

use crate::exit::UsageError;

/// Which groups of options each command offers.
pub(crate) mod offers {
    use kernel::options::{ALL_GROUPS, Group, Groups};

    /// `rlm run` and `rlm chat`: every option but the agent sandbox's and the run
    /// database's.
    pub(crate) const RUN: Groups = ALL_GROUPS & !Group::Agent.bit() & !DURABLE;
    /// `rlm demo`: as `rlm run`, without how files load (it makes its own context).
    pub(crate) const DEMO: Groups = RUN & !Group::Load.bit();
    /// `rlm eval`: as `rlm demo`, without the live trace (runs go in parallel).
    pub(crate) const EVAL: Groups = DEMO & !Group::Trace.bit();
    /// `rlm agent`: the models, budget and limits of its function-calling loop, the session
    /// of `--python`, the trace, the roots of the bundle's tools.
    pub(crate) const AGENT: Groups = Group::Agent.bit()
        | Group::Models.bit()
        | Group::Budget.bit()
        | Group::Iterations.bit()
        | Group::Timeout.bit()
        | Group::Session.bit()
        | Group::Trace.bit()
        | Group::Output.bit();
    /// `rlm flow run` and `resume`: the models and budget, the run's time limit, the
    /// session and how its contexts load, the run database and the lease on the run.
    pub(crate) const FLOW: Groups = Group::Models.bit()
        | Group::Budget.bit()
        | Group::Timeout.bit()
        | Group::Session.bit()
        | Group::Load.bit()
        | Group::Output.bit()
        | DURABLE;
    /// Where a workflow run is checkpointed: the run database and the lease on the run
    /// (`rlm flow demo` takes these; its models are scripted).
    pub(crate) const DURABLE: Groups = Group::Database.bit() | Group::Lease.bit();
    /// `rlm flow runs`, `history` and `decisions`: the run database they read.
    pub(crate) const RECORDS: Groups = Group::Database.bit();
    /// The runs `rlm eval --ray` makes through the Python package: `rlm eval`'s options that
    /// the package takes (not the trajectory: each run names its own; not the command's
    /// output).
    pub(crate) const RAY: Groups =
        EVAL & !Group::Trajectory.bit() & !Group::Answer.bit() & !Group::Output.bit();
    /// `rlm bench`: the endpoint measured and the budget of the sweep.
    pub(crate) const BENCH: Groups =
        Group::Models.bit() | Group::Budget.bit() | Group::Output.bit();
}

/// The options a command was given as flags, in the groups `G` (see [`offers`]), as text:
/// the schema checks them when [`settings`](Self::settings) reads them, so a bad value gets
/// the message every source gets ("`--timeout` must be a positive number of seconds …").
#[derive(Debug, Clone, Default)]
pub(crate) struct RunFlags<const G: Groups> {
    given: Vec<(&'static str, Vec<String>)>,
}

impl<const G: Groups> RunFlags<G> {
    /// Whether `--json` was given (and not `--json=false`), whatever else is wrong: a
    /// failure is then reported as a JSON document too.
    pub(crate) fn json(&self) -> bool {
        self.given
            .iter()
            .find(|(name, _)| *name == "json")
            .and_then(|(_, values)| values.last())
            .is_some_and(|text| text == "true")
    }

    /// The options given as flags; a bad value is a usage error.
    pub(crate) fn given(&self) -> Result<RunOptions> {
        RunOptions::from_text(&Source::Flag, self.given.iter().cloned()).map_err(option_error)
    }

    /// These flags over the environment over the configuration file (`config`, else
    /// `RLM_CONFIG`, else `./rlm.toml`), keeping the command's groups.
    pub(crate) fn settings(self, config: Option<&Path>) -> Result<Settings> {
        self.settings_over(RunOptions::default(), config)
    }

    /// These flags over `kept` (a resumed run's stored settings) over the environment over
    /// the configuration file, keeping the command's groups.
    pub(crate) fn settings_over(self, kept: RunOptions, config: Option<&Path>) -> Result<Settings> {
        let flags = self.given()?;
        let (merged, file) = flags
            .clone()
            .combine(kept)
            .layered(config)
            .map_err(option_error)?;
        Ok(Settings {
            opts: merged.only(G),
            flags,
            file,
        })
    }
}

/// A command's settings.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    /// Every source merged: what the command runs with.
    pub(crate) opts: RunOptions,
    /// What was given as flags (a command refuses a flag it cannot honour, but ignores the
    /// same option from a file shared with other commands).
    pub(crate) flags: RunOptions,
    /// The configuration file read, if any (an input no output may overwrite).
    pub(crate) file: Option<PathBuf>,
}

/// The output switches of [`RunOptions`], off unless set.
pub(crate) trait Switches {
    /// `--json`.
    fn json(&self) -> bool;
    /// `--quiet`.
    fn quiet(&self) -> bool;
    /// `--trace`.
    fn trace(&self) -> bool;
    /// `--force`.
    fn force(&self) -> bool;
}

impl Switches for RunOptions {
    fn json(&self) -> bool {
        self.json.unwrap_or(false)
    }

    fn quiet(&self) -> bool {
        self.quiet.unwrap_or(false)
    }

    fn trace(&self) -> bool {
        self.trace.unwrap_or(false)
    }

    fn force(&self) -> bool {
        self.force.unwrap_or(false)
    }
}

/// An option error as the binary reports it: wrong options are a usage error (exit 2), a
/// file that cannot be read or the endpoints failing are errors (exit 1).
pub(crate) fn option_error(error: OptionError) -> anyhow::Error {
    if error.is_usage() {
        UsageError::new(error.to_string()).into()
    } else {
        error.into()
    }
}

impl<const G: Groups> Args for RunFlags<G> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        offered::<G>().fold(cmd, |cmd, spec| cmd.arg(flag(spec)))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl<const G: Groups> FromArgMatches for RunFlags<G> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let given = offered::<G>()
            .filter_map(|spec| {
                let values = matches.try_get_many::<String>(spec.name).ok().flatten()?;
                Some((spec.name, values.cloned().collect()))
            })
            .collect();
        Ok(Self { given })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

/// The options of the groups `G`, in the schema's order.
fn offered<const G: Groups>() -> impl Iterator<Item = &'static OptionSpec> {
    OPTIONS.iter().filter(|spec| G & spec.group.bit() != 0)
}

/// The flag of `spec`.
fn flag(spec: &'static OptionSpec) -> Arg {
    // As clap shows doc comments: one paragraph without its closing period.
    let text = spec.help_text();
    let text = text.strip_suffix('.').unwrap_or(&text);
    let (help, long_help) = match spec.env {
        Some(var) => (
            format!("{text} [env: {var}]"),
            format!("{text}\n\n[env: {var}]"),
        ),
        None => (text.to_owned(), text.to_owned()),
    };
    let arg = Arg::new(spec.name)
        .long(spec.flag_name())
        .help(help)
        .long_help(long_help)
        .value_name(
            spec.value_name
                .map_or_else(|| spec.name.to_uppercase(), str::to_owned),
        )
        .action(if spec.repeated {
            ArgAction::Append
        } else {
            ArgAction::Set
        });
    let names = |choices: &'static [Choice]| {
        PossibleValuesParser::new(choices.iter().map(|choice| {
            let value = PossibleValue::new(choice.name).aliases(choice.aliases.iter().copied());
            match choice.help {
                "" => value,
                help => value.help(help),
            }
        }))
        .try_map(move |text| spec.parse_text(&text).map(|_| text))
    };
    match spec.kind {
        Kind::Switch => arg
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .value_parser(names(SWITCH)),
        Kind::Choice(choices) => arg.value_parser(names(choices)),
        // Checked by the schema when the matches are read, so the message is the one every
        // source gets: "`--timeout` must be a positive number of seconds …".
        _ => arg,
    }
}

/// The values of a switch on the command line.
const SWITCH: &[Choice] = &[
    Choice {
        name: "true",
        aliases: &[],
        help: "",
    },
    Choice {
        name: "false",
        aliases: &[],
        help: "",
    },
];

/// A whole number of at least `min`, for a command's own flags. With negative numbers
/// allowed as values, `-1` gets "must be ≥ 1, got -1" instead of clap's "unexpected argument
/// '-1'".
pub(crate) fn at_least<T>(
    min: i64,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i64> + Clone + Send + Sync + 'static,
{
    move |text| {
        let n: i64 = text
            .trim()
            .parse()
            .map_err(|_| format!("must be a whole number ≥ {min}, got `{text}`"))?;
        if n < min {
            return Err(format!("must be ≥ {min}, got {n}"));
        }
        T::try_from(n).map_err(|_| format!("must be at most {}, got {n}", i64::MAX))
    }
}
