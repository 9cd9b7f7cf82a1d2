//! The linked task: customer messages from many users; the query asks for every pair of users
//! who sent a message of one category **on the same date**. The answer is a relation between
//! pairs of records (two lines, two users, one date), not a property of each user: the task
//! `rlm eval --depths` is made for, where a child RLM can take a share of the dates and
//! relate their records with code of its own.

use std::collections::{BTreeMap, BTreeSet};

use super::entries::{self, CATEGORIES};
use super::pairs::Pairs;
use super::rng::SplitMix64;

/// The largest number of asked-category messages, so the answer stays a few hundred pairs.
const MAX_ASKED: usize = 120;

/// Messages of about `bytes` bytes: one line in twelve (at least 6, at most 120) is of the
/// asked category, on one of a few shared dates so that users meet; the other lines are of
/// other categories on any date, shared ones included.
pub(crate) fn generate(bytes: usize, rng: &mut SplitMix64) -> Pairs {
    let (lines, users) = entries::users(bytes, rng);
    let category = rng.below(CATEGORIES.len());
    let asked_count = (lines / 12).clamp(6, MAX_ASKED);
    // About three asked messages a shared date; a date is `(month, day, year)`.
    let mut shared = BTreeSet::new();
    while shared.len() < (asked_count / 3).max(2) {
        shared.insert(entries::random_date(rng));
    }
    let shared: Vec<entries::Date> = shared.into_iter().collect();
    let asked: Vec<(u64, entries::Date)> = (0..asked_count)
        .map(|_| (*rng.pick(&users), *rng.pick(&shared)))
        .collect();
    let context = entries::interleave(
        bytes,
        rng,
        asked.len(),
        |out, rng, i| {
            let (user, date) = asked[i];
            entries::write_entry_on(out, rng, category, user, date);
        },
        |out, rng| {
            let other = entries::other_category(rng, category);
            let user = *rng.pick(&users);
            // Half of the other lines fall on shared dates: a date alone links nobody.
            let date = if rng.below(2) == 0 {
                *rng.pick(&shared)
            } else {
                entries::random_date(rng)
            };
            entries::write_entry_on(out, rng, other, user, date);
        },
    );
    let mut by_date: BTreeMap<entries::Date, BTreeSet<u64>> = BTreeMap::new();
    for (user, date) in &asked {
        by_date.entry(*date).or_default().insert(*user);
    }
    let pairs = by_date.values().flat_map(pairs_among).collect();
    Pairs {
        context,
        category,
        pairs,
    }
}

/// Every pair `(smaller, larger)` of distinct `users`.
fn pairs_among(users: &BTreeSet<u64>) -> Vec<(u64, u64)> {
    let users: Vec<u64> = users.iter().copied().collect();
    let mut pairs = Vec::new();
    for (i, a) in users.iter().enumerate() {
        pairs.extend(users[i + 1..].iter().map(|b| (*a, *b)));
    }
    pairs
}

/// The query for pairs of users with a message of `category` on the same date.
pub(crate) fn query(category: usize) -> String {
    let c = &CATEGORIES[category];
    format!(
        "The context has one customer message per line (`{}`). Every message belongs to exactly \
         one of these categories: {}. The category is not written down: infer it from the \
         message. List every pair of distinct users who both sent a message of the category \
         `{}` on the same date. Write each pair once as `(SMALLER_ID, LARGER_ID)`, one pair per \
         line.",
        entries::LINE_FORMAT,
        entries::describe_categories(),
        c.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs a reader gets from the text: asked-category lines grouped by date.
    fn pairs_in(text: &str, category: usize) -> BTreeSet<(u64, u64)> {
        let keywords = CATEGORIES[category].keywords;
        let mut by_date: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
        for line in text.lines() {
            if !keywords.iter().any(|k| line.to_lowercase().contains(k)) {
                continue;
            }
            let mut fields = line.split(" || ");
            let date = fields.next().expect("a date");
            let user = fields
                .next()
                .and_then(|f| f.strip_prefix("User: "))
                .and_then(|u| u.parse().ok())
                .expect("a user id");
            by_date.entry(date).or_default().insert(user);
        }
        by_date.values().flat_map(pairs_among).collect()
    }

    #[test]
    fn the_truth_is_what_the_text_says_and_dates_matter() {
        for (bytes, seed) in [(8_000, 1), (40_000, 5), (400_000, 9)] {
            let mut rng = SplitMix64::new(seed);
            let l = generate(bytes, &mut rng);
            assert!(l.context.len() >= bytes);
            assert!(!l.pairs.is_empty(), "users meet on shared dates");
            assert_eq!(pairs_in(&l.context, l.category), l.pairs);
            // Pairing every sender (the pairs task's answer) is wrong here: dates matter.
            let senders: BTreeSet<u64> = l.pairs.iter().flat_map(|(a, b)| [*a, *b]).collect();
            assert!(
                l.pairs.len() < senders.len() * (senders.len() - 1) / 2,
                "{bytes}: some senders never share a date"
            );
        }
    }
}
