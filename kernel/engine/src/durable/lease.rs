//! One run, one writer: the lease a process holds on the run it drives.
//!
//! A process claims a run before it writes ([`Store::claim`], or [`Store::create_run`] for a
//! new one) and gets a [`Lease`]; every checkpoint and status change checks, in its own
//! transaction, that the lease is still the run's (fencing), so two processes can never
//! interleave their histories in one chain. The owner is recorded as an [`Owner`]: pid, host
//! and the process's start (on Linux the boot id and the start time in ticks from `/proc`),
//! so a pid reused by another process is not mistaken for it. The host is the machine's name,
//! or `RLM_HOST_ID` when set (machines that share a name, and tests that play several hosts
//! on one machine, set it).
//!
//! Whether a holder may be replaced ([`LeaseHolder::liveness`]):
//!
//! - an owner on this host whose pid is gone or names another process is
//!   [`Liveness::Dead`] and is taken over at once; a live one is never taken over;
//! - a lease with an expiry (PostgreSQL's: the driver renews it with a heartbeat) that ran out
//!   is dead too, on any host: the driver stopped heartbeating (killed, frozen, cut off), and
//!   its writes are refused from the moment it expired; one still renewed on another host is
//!   [`Liveness::Renewed`], taken over only on request (`--take-over`);
//! - a lease without an expiry (SQLite's) on another host (a shared disk), or on a system
//!   without `/proc`, cannot be checked ([`Liveness::Unchecked`]) and is taken over only on
//!   request.

use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

#[cfg(doc)]
use super::Store;

/// A process that drives (or drove) a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// Its process id.
    pub pid: u32,
    /// The host it runs on.
    pub host: String,
    /// When it started, as an opaque token (on Linux `BOOT_ID:TICKS`; empty where unknown).
    pub(crate) started: String,
}

/// Whether a lease's owner still runs, as far as this process can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    /// It runs (on this host, with the same start).
    Alive,
    /// It is gone: its pid is free, a zombie, or another process's; or its lease expired
    /// without a heartbeat.
    Dead,
    /// It runs on another host and renews its lease (a heartbeat): it has not expired.
    Renewed,
    /// It cannot be checked: another host, or a system without `/proc`.
    Unchecked,
}

impl Owner {
    /// This process.
    pub fn current() -> Self {
        let pid = std::process::id();
        Self {
            pid,
            host: host_name(),
            started: process_start(pid).unwrap_or_default(),
        }
    }

    /// Whether it still runs; see [`Liveness`].
    pub(crate) fn liveness(&self) -> Liveness {
        if self.host != host_name() || self.started.is_empty() || !cfg!(target_os = "linux") {
            return Liveness::Unchecked;
        }
        match process_start(self.pid) {
            Some(started) if started == self.started => Liveness::Alive,
            _ => Liveness::Dead,
        }
    }
}

/// A run's lease as stored: its owner, since when, and until when without a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseHolder {
    /// The owning process.
    pub owner: Owner,
    /// When it claimed the run (Unix milliseconds).
    pub since_ms: i64,
    /// When the lease runs out unless renewed (Unix milliseconds, the database's clock);
    /// `None` for a lease without an expiry (SQLite's: the owner's pid is checked instead).
    pub expires_ms: Option<i64>,
    /// Whether it had run out when it was read.
    pub expired: bool,
}

impl LeaseHolder {
    /// Whether its owner still drives the run, as far as this process can tell; see the
    /// module docs.
    pub fn liveness(&self) -> Liveness {
        if self.expired {
            return Liveness::Dead;
        }
        match self.owner.liveness() {
            Liveness::Unchecked if self.expires_ms.is_some() => Liveness::Renewed,
            other => other,
        }
    }
}

impl std::fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} on host `{}` since {}",
            self.owner.pid,
            self.owner.host,
            time_of(self.since_ms)
        )
    }
}

/// Unix milliseconds as RFC 3339.
pub(super) fn time_of(ms: i64) -> String {
    crate::date::rfc3339(UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Proof that this process owns a run: what writes to it present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub(super) run_id: String,
    pub(super) id: i64,
}

impl Lease {
    /// The run it is on.
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// A granted claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The lease to write with.
    pub lease: Lease,
    /// The holder it replaced: a dead owner, or one taken over on request.
    pub replaced: Option<LeaseHolder>,
}

/// The variable that names this host in place of its name.
pub(crate) const HOST_ID_VARIABLE: &str = "RLM_HOST_ID";

/// This host's id: `RLM_HOST_ID`, else its name.
fn host_name() -> String {
    match std::env::var(HOST_ID_VARIABLE) {
        Ok(id) if !id.is_empty() => id,
        _ => machine_name(),
    }
}

/// This machine's name.
#[cfg(unix)]
fn machine_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, all gethostname writes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// This machine's name.
#[cfg(not(unix))]
fn machine_name() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_default()
}

/// The start of process `pid` as `BOOT_ID:TICKS` (ticks since boot, `/proc/PID/stat` field
/// 22), or `None` when no such process runs (a zombie counts as gone: it writes nothing).
#[cfg(target_os = "linux")]
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields resume after the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X" | "x") {
        return None;
    }
    // `fields` now starts at field 4; the start time is field 22.
    let ticks = fields.nth(22 - 4)?;
    // The boot id tells a pid and tick count of this boot from the same numbers before a reboot.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    Some(format!("{}:{ticks}", boot.trim()))
}

/// Process starts are not read on this system: owners stay [`Liveness::Unchecked`].
#[cfg(not(target_os = "linux"))]
fn process_start(_pid: u32) -> Option<String> {
    None
}
