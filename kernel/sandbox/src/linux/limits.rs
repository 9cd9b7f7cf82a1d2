//! Resource limits of the confined process (rlimits) and the cap on its processes.
//!
//! Memory is `RLIMIT_DATA` (writable private memory: heap, anonymous mappings, stacks):
//! unlike `RLIMIT_AS` it does not count a memory-mapped context file or the address space
//! that allocators reserve but never touch, and hitting it fails an allocation (Python's
//! `MemoryError`) instead of calling the OOM killer. Core dumps are off: the worker's memory
//! holds the user's contexts.
//!
//! The process cap is `RLIMIT_NPROC`, which the kernel enforces per user and per user
//! namespace — except for root (uid 0 of the initial namespace), for whom it never applies.
//! Root's cap is the PID namespace's own `pid_max` instead (see
//! [`ns::cap_pids`](super::ns::cap_pids)).

use rustix::process::{Resource, Rlimit};

use crate::policy::Limits;
use crate::report::State;

/// Seconds between `SIGXCPU` (soft CPU limit) and `SIGKILL` (hard limit).
const CPU_GRACE_SECONDS: u64 = 5;

/// The rlimits of `limits`: resource, soft and hard value, and how the report names it.
fn rlimits(limits: &Limits) -> Vec<(Resource, u64, u64, String)> {
    let mut out = Vec::new();
    if let Some(bytes) = limits.memory_bytes {
        out.push((
            Resource::Data,
            bytes,
            bytes,
            format!("memory {}", bytes_text(bytes)),
        ));
    }
    if let Some(secs) = limits.cpu_seconds {
        out.push((
            Resource::Cpu,
            secs,
            secs + CPU_GRACE_SECONDS,
            format!("CPU {secs} s"),
        ));
    }
    if let Some(bytes) = limits.file_size_bytes {
        out.push((
            Resource::Fsize,
            bytes,
            bytes,
            format!("file size {}", bytes_text(bytes)),
        ));
    }
    if let Some(n) = limits.open_files {
        out.push((Resource::Nofile, n, n, format!("{n} open files")));
    }
    out.push((Resource::Core, 0, 0, "no core dumps".into()));
    out
}

/// Applies the rlimits of `limits` (never raising one) and reports them. A write past the
/// file size limit then fails with `EFBIG` ("File too large") instead of killing the
/// process with `SIGXFSZ`: the signal is ignored, here and in every program it starts.
pub(crate) fn apply(limits: &Limits) -> State {
    // SAFETY: sets the disposition of one signal to "ignore"; no handler runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mut applied = Vec::new();
    let mut failed = Vec::new();
    for (resource, soft, hard, label) in rlimits(limits) {
        match lower(resource, soft, hard) {
            Ok(()) => applied.push(label),
            Err(e) => failed.push(format!("{label}: {e}")),
        }
    }
    if failed.is_empty() {
        State::Active {
            detail: applied.join(", "),
        }
    } else {
        State::Partial {
            detail: applied.join(", "),
            missing: failed.join("; "),
        }
    }
}

/// The limits layer as `apply` would set it.
pub(crate) fn describe(limits: &Limits) -> State {
    let labels: Vec<String> = rlimits(limits)
        .into_iter()
        .map(|(.., label)| label)
        .collect();
    State::Active {
        detail: labels.join(", "),
    }
}

/// Sets a limit to at most `soft`/`hard`, keeping a lower inherited one.
fn lower(resource: Resource, soft: u64, hard: u64) -> rustix::io::Result<()> {
    let current = rustix::process::getrlimit(resource);
    let hard = current.maximum.map_or(hard, |max| max.min(hard));
    let soft = current.current.map_or(soft, |cur| cur.min(soft)).min(hard);
    rustix::process::setrlimit(
        resource,
        Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        },
    )
}

/// Caps processes and threads with `RLIMIT_NPROC`. Counted per user namespace: in our own
/// namespace only the confined tree counts (plus the supervisor and init); without one, every
/// process of the user does, so the cap is added to what runs already.
pub(crate) fn cap_processes(processes: u64, own_user_namespace: bool) -> rustix::io::Result<u64> {
    let base = if own_user_namespace {
        2
    } else {
        tasks_of_current_user()
    };
    let limit = base + processes;
    lower(Resource::Nproc, limit, limit)?;
    Ok(limit)
}

/// Tasks (processes and threads) of the real uid, from `/proc`.
fn tasks_of_current_user() -> u64 {
    let uid = rustix::process::getuid().as_raw().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .filter(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1))
                == Some(uid.as_str())
        })
        .map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(1)
        })
        .sum()
}

/// `4 GiB`, `512 MiB`, `1000 B`.
pub(crate) fn bytes_text(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64).replace(".0 ", " ")
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::bytes_text;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes_text(4 << 30), "4 GiB");
        assert_eq!(bytes_text(12 << 30), "12 GiB");
        assert_eq!(bytes_text(3 << 29), "1.5 GiB");
        assert_eq!(bytes_text(256 << 20), "256 MiB");
        assert_eq!(bytes_text(1000), "1000 B");
    }
}
