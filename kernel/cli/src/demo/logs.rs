//! Synthetic service logs with a known answer: how many `level=ERROR` lines each service has.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Services and their share of error lines; uneven so that a wrong split shows.
const SERVICES: [(&str, f64); 8] = [
    ("auth", 0.021),
    ("billing", 0.047),
    ("checkout", 0.013),
    ("gateway", 0.008),
    ("inventory", 0.032),
    ("notifications", 0.056),
    ("reports", 0.004),
    ("search", 0.017),
];

const MESSAGES: [&str; 6] = [
    "request handled",
    "cache refreshed",
    "upstream responded slowly",
    "retrying idempotent call",
    "connection pool resized",
    "payload validated",
];

const ERROR_MESSAGES: [&str; 4] = [
    "upstream timed out",
    "database deadlock detected",
    "unexpected status from dependency",
    "message rejected by schema",
];

/// Generated logs and the per-service error counts they contain.
#[derive(Debug)]
pub(crate) struct SyntheticLogs {
    pub(crate) text: String,
    pub(crate) lines: u64,
    pub(crate) errors_by_service: BTreeMap<String, u64>,
}

/// Generates about `bytes` of log lines, deterministic for a seed.
pub(crate) fn generate(bytes: usize, seed: u64) -> SyntheticLogs {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut text = String::with_capacity(bytes + 256);
    let mut errors_by_service: BTreeMap<String, u64> =
        SERVICES.iter().map(|(s, _)| (s.to_string(), 0)).collect();
    let mut lines = 0u64;
    let mut millis: u64 = 1_795_651_200_000; // 2026-11-26T00:00:00Z
    while text.len() < bytes {
        let (service, error_rate) = SERVICES[rng.random_range(0..SERVICES.len())];
        millis += rng.random_range(1..40);
        let (secs, ms) = (millis / 1000, millis % 1000);
        let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        let roll: f64 = rng.random();
        let (level, msg) = if roll < error_rate {
            *errors_by_service.entry(service.to_string()).or_default() += 1;
            (
                "ERROR",
                ERROR_MESSAGES[rng.random_range(0..ERROR_MESSAGES.len())],
            )
        } else if roll < error_rate + 0.08 {
            // Warnings mention errors in prose, so counting the word "error" is not enough.
            ("WARN", "recovered from a transient error")
        } else {
            ("INFO", MESSAGES[rng.random_range(0..MESSAGES.len())])
        };
        let latency = rng.random_range(2..900);
        let trace: u32 = rng.random();
        let _ = writeln!(
            text,
            "2026-11-26T{h:02}:{m:02}:{s:02}.{ms:03}Z level={level} service={service} \
             trace={trace:08x} latency_ms={latency} msg=\"{msg}\""
        );
        lines += 1;
    }
    SyntheticLogs {
        text,
        lines,
        errors_by_service,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_the_text_and_the_seed_repeats() {
        let logs = generate(1_000_000, 3);
        assert!(logs.text.len() >= 1_000_000);
        for (service, count) in &logs.errors_by_service {
            let needle = format!("level=ERROR service={service} ");
            assert_eq!(
                logs.text.matches(&needle).count() as u64,
                *count,
                "{service}"
            );
        }
        assert!(logs.errors_by_service.values().all(|&n| n > 0));
        assert!(
            generate(1_000_000, 3).text == logs.text,
            "same seed, same logs"
        );
        assert!(
            generate(1_000_000, 4).text != logs.text,
            "another seed, other logs"
        );
    }
}
