//! The aggregate task (OOLONG style): thousands of customer messages whose category must be
//! inferred from the wording; the query asks how many messages each category has.

use std::collections::BTreeMap;

use super::entries::{self, CATEGORIES};
use super::rng::SplitMix64;

/// Messages of about `bytes` bytes in total, with per-instance category weights; returns the
/// text and the true count of each category (every category is present, possibly with 0).
pub(crate) fn generate(bytes: usize, rng: &mut SplitMix64) -> (String, BTreeMap<String, u64>) {
    let weights: Vec<u64> = CATEGORIES.iter().map(|_| rng.between(1, 10)).collect();
    let total: u64 = weights.iter().sum();
    let users: Vec<u64> = (0..64).map(|_| rng.between(10_000, 99_999)).collect();
    let mut counts = vec![0u64; CATEGORIES.len()];
    let mut text = String::with_capacity(bytes + 200);
    while text.len() < bytes {
        let mut draw = rng.between(1, total);
        let category = weights
            .iter()
            .position(|w| {
                if draw <= *w {
                    true
                } else {
                    draw -= w;
                    false
                }
            })
            .unwrap_or(0);
        counts[category] += 1;
        let user = *rng.pick(&users);
        entries::write_entry(&mut text, rng, category, user);
    }
    let truth = CATEGORIES
        .iter()
        .zip(counts)
        .map(|(c, n)| (c.name.to_owned(), n))
        .collect();
    (text, truth)
}

/// The query.
pub(crate) fn query() -> String {
    format!(
        "The context has one customer message per line (`{}`). Every message belongs to exactly \
         one of these categories: {}. The category is not written down: infer it from the \
         message. Count the messages of each category. Answer with a JSON object mapping every \
         category name to its count, e.g. {{\"billing\": 12, \"delivery\": 7, ...}}.",
        entries::LINE_FORMAT,
        entries::describe_categories()
    )
}

/// OOLONG's rule for numbers, averaged over the categories: a count off by `d` scores
/// `0.75^d` (a missing category counts as 0; a category the truth does not have, given a
/// count other than 0, is one more category whose true count is 0). An answer with no JSON
/// object of counts scores 0; names are matched without regard to case or surrounding
/// blanks. Returns the score and whether every count is exactly right (score 1).
pub(crate) fn score(answer: &str, truth: &BTreeMap<String, u64>) -> (f64, bool) {
    let Some(got) = parse_counts(answer) else {
        return (0.0, false);
    };
    let extra = got
        .iter()
        .filter(|(name, n)| !truth.contains_key(name.as_str()) && **n != 0)
        .map(|(name, n)| (name, 0, *n));
    let scored = truth
        .iter()
        .map(|(name, want)| (name, *want, got.get(name.as_str()).copied().unwrap_or(0)))
        .chain(extra);
    let (mut sum, mut len, mut exact) = (0.0, 0usize, true);
    for (_, want, have) in scored {
        let off = have.abs_diff(want);
        exact &= off == 0;
        sum += 0.75f64.powi(i32::try_from(off).unwrap_or(i32::MAX));
        len += 1;
    }
    if len == 0 {
        return (1.0, true);
    }
    (if exact { 1.0 } else { sum / len as f64 }, exact)
}

/// The first JSON object in `answer` whose values are all whole numbers (or strings of
/// them), keyed by lower-cased, trimmed names.
fn parse_counts(answer: &str) -> Option<BTreeMap<String, u64>> {
    answer.match_indices('{').find_map(|(at, _)| {
        let mut stream =
            serde_json::Deserializer::from_str(&answer[at..]).into_iter::<serde_json::Value>();
        let serde_json::Value::Object(map) = stream.next()?.ok()? else {
            return None;
        };
        let mut counts = BTreeMap::new();
        for (name, value) in map {
            let n = match &value {
                serde_json::Value::Number(n) => n.as_u64().or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                        .map(|f| f as u64)
                }),
                serde_json::Value::String(s) => s.trim().parse().ok(),
                _ => None,
            }?;
            *counts.entry(name.trim().to_lowercase()).or_insert(0) += n;
        }
        Some(counts)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth() -> BTreeMap<String, u64> {
        [
            ("billing".to_owned(), 3),
            ("praise".to_owned(), 0),
            ("feature".to_owned(), 10),
        ]
        .into()
    }

    #[test]
    fn hand_checked_answers() {
        let t = truth();
        let third = 1.0 / 3.0;
        for (answer, score_expected, exact) in [
            (r#"{"billing": 3, "praise": 0, "feature": 10}"#, 1.0, true),
            // Extra text around the object, other key order, case and blanks, a missing zero.
            (
                "Here you go:\n```json\n{\"Feature \": 10, \"BILLING\": 3}\n```\nDone.",
                1.0,
                true,
            ),
            (
                r#"{"billing": "3", "praise": 0.0, "feature": 10}"#,
                1.0,
                true,
            ),
            // One off by one: (0.75 + 1 + 1) / 3; off by two on another: (0.75 + 1 + 0.5625) / 3.
            (
                r#"{"billing": 4, "praise": 0, "feature": 10}"#,
                2.75 * third,
                false,
            ),
            (
                r#"{"billing": 4, "praise": 0, "feature": 8}"#,
                2.3125 * third,
                false,
            ),
            // A category that does not exist, with a count, is one more that is off: by two.
            (
                r#"{"billing": 3, "praise": 0, "feature": 10, "spam": 2}"#,
                3.5625 / 4.0,
                false,
            ),
            (
                r#"{"billing": 3, "praise": 0, "feature": 10, "spam": 0}"#,
                1.0,
                true,
            ),
            // The first object that is counts wins; a prose brace before it is skipped.
            (
                r#"Counts {as asked}: {"billing": 3, "feature": 10}"#,
                1.0,
                true,
            ),
            ("billing 3, feature 10", 0.0, false),
            (r#"{"billing": "three"}"#, 0.0, false),
            (r#"{"billing": -3}"#, 0.0, false),
            ("", 0.0, false),
        ] {
            let (score_got, exact_got) = score(answer, &t);
            assert!(
                (score_got - score_expected).abs() < 1e-12,
                "{answer:?}: {score_got}"
            );
            assert_eq!(exact_got, exact, "{answer:?}");
        }
    }

    #[test]
    fn the_truth_counts_every_line() {
        let mut rng = SplitMix64::new(4);
        let (text, truth) = generate(30_000, &mut rng);
        assert_eq!(truth.len(), CATEGORIES.len());
        assert_eq!(truth.values().sum::<u64>(), text.lines().count() as u64);
        let (s, exact) = score(&serde_json::to_string(&truth).expect("json"), &truth);
        assert!(exact && s == 1.0);
        assert!(query().contains("billing (payments, refunds, invoices)"));
    }
}
