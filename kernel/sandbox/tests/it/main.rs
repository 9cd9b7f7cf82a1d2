//! Hostile tests of the confinement layers: each runs an attack in Python under
//! `rlm-confine` (the crate's `enter`, then `execve`) and checks that the layer holds. The
//! `execve` makes the process dumpable again, which `enter` had turned off, so every attack's
//! Python first turns it off again, as rlm's worker has it (it embeds Python without an exec).
//!
//! Bounded: every run has a deadline (the supervisor is `SIGKILL`ed past it, which takes
//! the whole confined tree along), the harness lowers `RLIMIT_DATA` and `RLIMIT_NPROC` of
//! what it spawns on top of the policy's own limits, and every test ends by killing and
//! checking for any process left with its unique marker in the command line.
//!
//! As root (CI), the tests that depend on who runs them also run as an unprivileged user
//! (uid 65534), since that is how users run `rlm`: user namespaces, `RLIMIT_NPROC` and
//! Landlock then take the path they take for everyone.

mod support;

mod attacks;
mod report;
