//! The pairs task (OOLONG-Pairs style): customer messages from many users; the query asks for
//! every pair of users who both sent a message of one category — quadratic in its answer.

use std::collections::BTreeSet;

use regex::Regex;

use super::entries::{self, CATEGORIES};
use super::rng::SplitMix64;

/// The largest number of users who qualify, so the answer stays at most 780 pairs.
const MAX_QUALIFYING: usize = 40;

/// A pairs (or linked) instance: the text, the asked category and the true pairs
/// `(smaller, larger)`.
pub(crate) struct Pairs {
    pub(crate) context: String,
    pub(crate) category: usize,
    pub(crate) pairs: BTreeSet<(u64, u64)>,
}

/// Messages of about `bytes` bytes: one user in four (at most 40, at least 2) sends one to
/// three messages of the asked category; nobody else sends any of it.
pub(crate) fn generate(bytes: usize, rng: &mut SplitMix64) -> Pairs {
    let (_, users) = entries::users(bytes, rng);
    let user_count = users.len();
    let category = rng.below(CATEGORIES.len());
    let qualifying_count = (user_count / 4).clamp(2, MAX_QUALIFYING);
    let mut qualifying = BTreeSet::new();
    while qualifying.len() < qualifying_count {
        qualifying.insert(*rng.pick(&users));
    }
    // The asked category's lines, at random positions among the others.
    let mut asked: Vec<u64> = Vec::new();
    for user in &qualifying {
        for _ in 0..rng.between(1, 3) {
            asked.push(*user);
        }
    }
    let context = entries::interleave(
        bytes,
        rng,
        asked.len(),
        |out, rng, i| entries::write_entry(out, rng, category, asked[i]),
        |out, rng| {
            let other = entries::other_category(rng, category);
            let user = *rng.pick(&users);
            entries::write_entry(out, rng, other, user);
        },
    );
    let qualifying: Vec<u64> = qualifying.into_iter().collect();
    let pairs = qualifying
        .iter()
        .enumerate()
        .flat_map(|(i, a)| qualifying[i + 1..].iter().map(move |b| (*a, *b)))
        .collect();
    Pairs {
        context,
        category,
        pairs,
    }
}

/// The query for pairs of users with a message of `category`.
pub(crate) fn query(category: usize) -> String {
    let c = &CATEGORIES[category];
    format!(
        "The context has one customer message per line (`{}`). Every message belongs to exactly \
         one of these categories: {}. The category is not written down: infer it from the \
         message. List every pair of distinct users who both sent at least one message of the \
         category `{}`. Write each pair once as `(SMALLER_ID, LARGER_ID)`, one pair per line.",
        entries::LINE_FORMAT,
        entries::describe_categories(),
        c.name
    )
}

/// F1 of the pairs in `answer` against `truth`. Every `A, B` of two numbers (in parentheses,
/// brackets or bare) is a pair; order inside a pair does not matter, and a pair given twice
/// (either way round) counts once. Returns the F1 and whether the sets are equal. No pairs
/// expected and none given is a perfect answer.
pub(crate) fn score(answer: &str, truth: &BTreeSet<(u64, u64)>) -> (f64, bool) {
    let given = parse_pairs(answer);
    if truth.is_empty() && given.is_empty() {
        return (1.0, true);
    }
    let hits = given.intersection(truth).count() as f64;
    if hits == 0.0 {
        return (0.0, false);
    }
    let precision = hits / given.len() as f64;
    let recall = hits / truth.len() as f64;
    let f1 = 2.0 * precision * recall / (precision + recall);
    (f1, given == *truth)
}

fn parse_pairs(answer: &str) -> BTreeSet<(u64, u64)> {
    // `regex` caches nothing between calls; scoring is not a hot path.
    let Ok(pair) = Regex::new(r"(\d+)\s*,\s*(\d+)") else {
        return BTreeSet::new();
    };
    pair.captures_iter(answer)
        .filter_map(|c| {
            let a: u64 = c[1].parse().ok()?;
            let b: u64 = c[2].parse().ok()?;
            Some((a.min(b), a.max(b)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth() -> BTreeSet<(u64, u64)> {
        [(11, 22), (11, 33), (22, 33)].into()
    }

    #[test]
    fn hand_checked_answers() {
        let t = truth();
        for (answer, f1, exact) in [
            ("(11, 22)\n(11, 33)\n(22, 33)", 1.0, true),
            // Reversed, repeated, other brackets and prose around them.
            (
                "Pairs: [22,11], (33, 11); (11,22) again, and 22 , 33.",
                1.0,
                true,
            ),
            ("[[11, 22], [11, 33], [22, 33], [33, 22]]", 1.0, true),
            // Two of three right, nothing wrong: P = 1, R = 2/3, F1 = 0.8.
            ("(11, 22)\n(11, 33)", 0.8, false),
            // Three right and one wrong: P = 3/4, R = 1, F1 = 6/7.
            ("(11, 22) (11, 33) (22, 33) (11, 44)", 6.0 / 7.0, false),
            // A self-pair is a wrong pair.
            ("(11, 22) (11, 33) (22, 33) (11, 11)", 6.0 / 7.0, false),
            ("(44, 55)", 0.0, false),
            ("none", 0.0, false),
            ("", 0.0, false),
        ] {
            let (got, got_exact) = score(answer, &t);
            assert!((got - f1).abs() < 1e-12, "{answer:?}: {got}");
            assert_eq!(got_exact, exact, "{answer:?}");
        }
        assert_eq!(score("no pairs", &BTreeSet::new()), (1.0, true));
        assert_eq!(score("(1, 2)", &BTreeSet::new()), (0.0, false));
    }

    #[test]
    fn exactly_the_qualifying_users_sent_the_category() {
        let mut rng = SplitMix64::new(5);
        let p = generate(40_000, &mut rng);
        let keywords = CATEGORIES[p.category].keywords;
        let senders: BTreeSet<u64> = p
            .context
            .lines()
            .filter(|l| keywords.iter().any(|k| l.to_lowercase().contains(k)))
            .map(|l| {
                let user = l.split("User: ").nth(1).and_then(|r| r.split(' ').next());
                user.and_then(|u| u.parse().ok()).expect("a user id")
            })
            .collect();
        let from_pairs: BTreeSet<u64> = p.pairs.iter().flat_map(|(a, b)| [*a, *b]).collect();
        assert_eq!(senders, from_pairs);
        assert_eq!(p.pairs.len(), senders.len() * (senders.len() - 1) / 2);
        assert!(p.context.len() >= 40_000);
    }
}
