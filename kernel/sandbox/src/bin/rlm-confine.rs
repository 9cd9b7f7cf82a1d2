//! `rlm-confine`: runs a command confined by a policy, as the worker confines itself.
//!
//! ```text
//! rlm-confine [--strict] --policy '<policy JSON>' -- COMMAND [ARG]...
//! rlm-confine --probe --policy '<policy JSON>'
//! ```
//!
//! Prints the report of what is in force as one JSON line on stderr (`rlm-confine: {…}`),
//! then executes the command in the confined process. Exit status: the command's, or 125
//! when confinement failed, 126/127 when the command could not be executed. The crate's
//! hostile tests run attacks through it; it is also a way to try a policy by hand.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use sandbox::{Level, Policy};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut level = Level::BestEffort;
    let mut policy_json = None;
    let mut probe = false;
    let mut command: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--strict" => level = Level::Strict,
            "--probe" => probe = true,
            "--policy" => {
                i += 1;
                policy_json = args.get(i).cloned();
            }
            "--" => {
                command = args[i + 1..].to_vec();
                break;
            }
            other => return usage(&format!("unknown argument `{other}`")),
        }
        i += 1;
    }
    let Some(json) = policy_json else {
        return usage("`--policy` is required");
    };
    let policy: Policy = match serde_json::from_str(&json) {
        Ok(p) => p,
        Err(e) => return usage(&format!("the policy is not valid JSON: {e}")),
    };
    if probe {
        print!("{}", sandbox::probe(&policy));
        return ExitCode::SUCCESS;
    }
    if command.is_empty() {
        return usage("no command after `--`");
    }
    let report = match sandbox::enter(&policy, level) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("rlm-confine: {e}");
            return ExitCode::from(125);
        }
    };
    eprintln!(
        "rlm-confine: {}",
        serde_json::to_string(&report).unwrap_or_default()
    );
    let err = Command::new(&command[0]).args(&command[1..]).exec();
    eprintln!("rlm-confine: could not execute `{}`: {err}", command[0]);
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "rlm-confine: {problem}\nusage: rlm-confine [--strict] --policy '<policy JSON>' -- COMMAND [ARG]...\n       rlm-confine --probe --policy '<policy JSON>'"
    );
    ExitCode::from(2)
}
