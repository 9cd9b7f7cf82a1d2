//! Seeded per-request randomness: each request draws from its own generator, keyed by the
//! server's seed and the request id, so draws take no lock and a seed replays the same
//! faults and latencies for the same arrival order.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// The generator of request `id` on a server seeded with `seed`.
pub(crate) fn for_request(seed: u64, id: u64) -> StdRng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&id.to_le_bytes());
    StdRng::from_seed(key)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mock::config::{FaultKind, Faults};
    use crate::mock::faults::FaultPlan;
    use crate::mock::latency::Latency;
    use crate::mock::prompt::Prompt;

    /// The fault and latency of requests `0..n` on a server seeded with `seed`.
    fn draws(seed: u64, n: u64) -> Vec<(Option<FaultKind>, Duration)> {
        let plan = FaultPlan::new(&Faults::random(0.3, FaultKind::ALL)).expect("valid faults");
        let latency = Latency::normal(Duration::from_millis(50), Duration::from_millis(20));
        let prompt = Prompt {
            model: "m",
            system: "",
            last_user: "hi",
            last_tool: None,
            tool_name: "",
            turn: 0,
        };
        (0..n)
            .map(|id| {
                let mut rng = for_request(seed, id);
                (plan.decide(&prompt, &mut rng), latency.sample(&mut rng))
            })
            .collect()
    }

    #[test]
    fn a_seed_replays_the_same_faults_and_latencies() {
        let a = draws(7, 200);
        assert_eq!(a, draws(7, 200), "same seed, same sequence");
        assert_ne!(a, draws(8, 200), "another seed, another sequence");
        let faults = a.iter().filter(|(f, _)| f.is_some()).count();
        assert!((30..=90).contains(&faults), "about 30% of 200: {faults}");
        let distinct: std::collections::HashSet<_> = a.iter().map(|(_, d)| *d).collect();
        assert!(distinct.len() > 190, "latencies are drawn, not fixed");
        let mean_ms = a.iter().map(|(_, d)| d.as_secs_f64()).sum::<f64>() / 200.0 * 1e3;
        assert!(
            (40.0..60.0).contains(&mean_ms),
            "normal around 50 ms: {mean_ms}"
        );
    }
}
