//! `rlm doctor`: which layers confining model code are in force on this machine, and for
//! each one that is not, why and what would change it.
//!
//! It asks [`sandbox::probe`] about the policy a session's worker gets, built by the same
//! [`kernel::repl::worker_policy`] the worker's spawn uses (scratch dir under the temporary
//! folder, default limits): namespaces are tried in a throwaway child, Landlock and seccomp
//! asked of the kernel. Nothing is confined or written.
//!
//! It also says whether the workers' code goes on huge pages here, and if not why and what
//! would change it: [`kernel::repl::try_huge_code`] runs the worker template's own checks and
//! copies in this process (the template is this executable), without moving anything.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

/// Arguments of `rlm doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print one JSON document (`fully_confined`, `layers` with `state` and `detail` or
    /// `reason`, `huge_code` with `windows`, `moved` and `reason`, `remedy` where not all
    /// moved) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Prints the report; exit code 0 whatever it says (it is a diagnosis, not a check).
pub(crate) fn execute(args: &DoctorArgs) -> Result<ExitCode> {
    let policy = kernel::repl::worker_policy(
        &kernel::repl::SessionConfig::default(),
        &std::env::temp_dir().join("rlm-SESSION"),
    );
    let report = sandbox::probe(&policy);
    let huge_code = kernel::repl::try_huge_code();
    let system = System::here();
    let mut out = std::io::stdout().lock();
    if args.json {
        let document = serde_json::json!({
            "rlm_version": env!("CARGO_PKG_VERSION"),
            "os": std::env::consts::OS,
            "arch": std::env::consts::ARCH,
            "kernel": system.kernel,
            "root": system.root,
            "fully_confined": report.is_fully_confined(),
            "layers": report.layers,
            "huge_code": {
                "page_size": huge_code.page,
                "windows": huge_code.windows,
                "moved": huge_code.moved,
                "reason": huge_code.refused.map(|why| why.to_string()),
                "remedy": huge_code.refused.and_then(|why| why.remedy()),
            },
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&document)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "Confinement of model code on this machine ({} {}, {}, {}):\n",
        std::env::consts::OS,
        system.kernel,
        std::env::consts::ARCH,
        if system.root {
            "running as root"
        } else {
            "running as a normal user"
        },
    )?;
    write!(out, "{report}")?;
    let missing = report.gaps().count();
    if missing == 0 {
        writeln!(
            out,
            "\nAll {} layers can be put in force here.",
            report.layers.len()
        )?;
    } else {
        writeln!(
            out,
            "\n{missing} of {} layers cannot be fully put in force here (see the reasons above).",
            report.layers.len()
        )?;
    }
    writeln!(
        out,
        "\nWorkers' code on huge pages (a worker idle through a model call wakes faster): \
         {huge_code}{}",
        if huge_code.moved > 0 {
            " (each tried here on a copy; as the loader places the code, a template may have \
             one more or fewer)"
        } else {
            ""
        }
    )?;
    if let Some(remedy) = huge_code.refused.and_then(|why| why.remedy()) {
        writeln!(out, "  to change it: {remedy}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The kernel release and whether we run as root.
struct System {
    kernel: String,
    root: bool,
}

impl System {
    fn here() -> Self {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "(kernel release unknown)".into());
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        Self { kernel, root }
    }
}
