//! Customer messages, one a line, whose category a reader must infer from the wording: the
//! context of the aggregate and pairs tasks (in the style of OOLONG's labelled instances).
//!
//! Each category's messages carry one of its [`Category::keywords`] and no other category's,
//! so a keyword classifier (the scripted sub-model) labels every line right; a language model
//! reads the meaning instead.

use super::rng::SplitMix64;

/// One category of customer messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Category {
    /// Its name, as the query and the answer spell it.
    pub name: &'static str,
    /// What it covers, as the query explains it.
    pub meaning: &'static str,
    /// Lower-case phrases of which every message of the category contains one.
    pub keywords: &'static [&'static str],
    messages: &'static [&'static str],
}

/// The categories, in the order queries list them.
pub const CATEGORIES: &[Category] = &[
    Category {
        name: "billing",
        meaning: "payments, refunds, invoices",
        keywords: &["refund", "charged twice", "invoice", "overcharged"],
        messages: &[
            "I was charged twice for my last order.",
            "Please send me the invoice for March.",
            "I still have not received my refund.",
            "My card was overcharged this month.",
            "Can you resend the invoice with my company name?",
            "When will the refund reach my bank?",
        ],
    },
    Category {
        name: "delivery",
        meaning: "shipping, parcels, couriers",
        keywords: &["package", "tracking", "courier", "arrived late"],
        messages: &[
            "My package is stuck in transit.",
            "The tracking number does not work.",
            "The courier left the box at the wrong door.",
            "The order arrived late and the box was wet.",
            "Could you tell me where my package is now?",
        ],
    },
    Category {
        name: "account",
        meaning: "signing in, passwords, profiles",
        keywords: &["password", "log in", "username", "locked out"],
        messages: &[
            "I cannot log in since yesterday.",
            "Please reset my password.",
            "I am locked out of my profile.",
            "How do I change my username?",
            "The password reset link has expired.",
        ],
    },
    Category {
        name: "technical",
        meaning: "crashes, errors, bugs",
        keywords: &["crash", "error message", "freezes", "bug"],
        messages: &[
            "The app crashes when I open the settings.",
            "I get an error message at checkout.",
            "The screen freezes after the update.",
            "There is a bug in the search page.",
            "Uploading a photo makes the whole thing crash.",
        ],
    },
    Category {
        name: "praise",
        meaning: "compliments and thanks",
        keywords: &["great job", "love the", "excellent", "thank you so much"],
        messages: &[
            "Great job on the new design!",
            "I love the latest update.",
            "Excellent service as always.",
            "Thank you so much for the quick help.",
            "Your support team did an excellent job today.",
        ],
    },
    Category {
        name: "feature",
        meaning: "requests for new features",
        keywords: &["please add", "would be nice", "suggest", "i wish"],
        messages: &[
            "Please add a dark mode.",
            "It would be nice to export reports as CSV.",
            "I suggest a weekly summary email.",
            "I wish the app had an offline mode.",
            "Please add more languages to the menu.",
        ],
    },
];

/// Words around a message that belong to no category.
const OPENERS: &[&str] = &[
    "",
    "Hi team, ",
    "Hello, ",
    "Good morning. ",
    "Quick note: ",
    "Hey there, ",
];
const CLOSERS: &[&str] = &[
    "",
    " Cheers.",
    " Regards, a customer.",
    " Sent from my phone.",
    " Have a nice day.",
    " Kind regards.",
];
const MONTHS: &[&str] = &[
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// The format of one line, for the queries.
pub(crate) const LINE_FORMAT: &str = "Date: MON DD, YYYY || User: ID || Instance: TEXT";

/// The lines (~100 bytes each, at least 16) of a context of about `bytes` bytes, and its
/// users: distinct five-digit ids, about one for eight lines (at least 8), in order.
pub(crate) fn users(bytes: usize, rng: &mut SplitMix64) -> (usize, Vec<u64>) {
    let lines = (bytes / 100).max(16);
    let count = (lines / 8).max(8);
    let mut users = std::collections::BTreeSet::new();
    while users.len() < count {
        users.insert(rng.between(10_000, 99_999));
    }
    (lines, users.into_iter().collect())
}

/// A context of at least `bytes` bytes with `asked` lines at random positions among other
/// lines: `write_asked(out, rng, i)` writes the asked line `i` (from the last to the first),
/// `write_other(out, rng)` one other line; each line about 100 bytes.
pub(crate) fn interleave(
    bytes: usize,
    rng: &mut SplitMix64,
    asked: usize,
    mut write_asked: impl FnMut(&mut String, &mut SplitMix64, usize),
    mut write_other: impl FnMut(&mut String, &mut SplitMix64),
) -> String {
    let mut context = String::with_capacity(bytes + 200);
    let mut pending = asked;
    while context.len() < bytes || pending > 0 {
        let remaining = bytes.saturating_sub(context.len()) / 100 + 1;
        if pending > 0 && rng.below(remaining + pending) < pending {
            pending -= 1;
            write_asked(&mut context, rng, pending);
        } else {
            write_other(&mut context, rng);
        }
    }
    context
}

/// A category other than `category`, at random.
pub(crate) fn other_category(rng: &mut SplitMix64, category: usize) -> usize {
    (category + 1 + rng.below(CATEGORIES.len() - 1)) % CATEGORIES.len()
}

/// A date of a message: month (index into the month names), day, year.
pub(crate) type Date = (usize, u64, u64);

/// A date from 2022 to 2024 (days 1 to 28 of any month).
pub(crate) fn random_date(rng: &mut SplitMix64) -> Date {
    let month = rng.below(MONTHS.len());
    let day = rng.between(1, 28);
    let year = rng.between(2022, 2024);
    (month, day, year)
}

/// Appends one line (with its newline): a message of `category` from `user`.
pub(crate) fn write_entry(out: &mut String, rng: &mut SplitMix64, category: usize, user: u64) {
    let date = random_date(rng);
    write_entry_on(out, rng, category, user, date);
}

/// Appends one line (with its newline): a message of `category` from `user` on `date`.
pub(crate) fn write_entry_on(
    out: &mut String,
    rng: &mut SplitMix64,
    category: usize,
    user: u64,
    (month, day, year): Date,
) {
    let c = &CATEGORIES[category];
    let month = MONTHS[month % MONTHS.len()];
    let opener = rng.pick(OPENERS);
    let text = rng.pick(c.messages);
    let closer = rng.pick(CLOSERS);
    out.push_str(&format!(
        "Date: {month} {day:02}, {year} || User: {user} || Instance: {opener}{text}{closer}\n"
    ));
}

/// The category list as queries show it: `billing (payments, refunds, invoices), …`.
pub(crate) fn describe_categories() -> String {
    CATEGORIES
        .iter()
        .map(|c| format!("{} ({})", c.name, c.meaning))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the scripted sub-model does: the first category with a keyword in the line.
    fn classify(line: &str) -> Option<usize> {
        let lower = line.to_lowercase();
        CATEGORIES
            .iter()
            .position(|c| c.keywords.iter().any(|k| lower.contains(k)))
    }

    #[test]
    fn every_message_carries_its_own_keywords_and_no_other() {
        for (i, c) in CATEGORIES.iter().enumerate() {
            for message in c.messages {
                for opener in OPENERS {
                    for closer in CLOSERS {
                        let text = format!("{opener}{message}{closer}").to_lowercase();
                        for (j, other) in CATEGORIES.iter().enumerate() {
                            let hits = other.keywords.iter().any(|k| text.contains(k));
                            assert_eq!(hits, i == j, "`{text}` and category {}", other.name);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn lines_are_classified_by_their_category() {
        let mut rng = SplitMix64::new(3);
        for category in 0..CATEGORIES.len() {
            let mut line = String::new();
            write_entry(&mut line, &mut rng, category, 12345);
            assert!(line.starts_with("Date: ") && line.ends_with('\n'), "{line}");
            assert!(line.contains("|| User: 12345 || Instance: "), "{line}");
            assert_eq!(classify(&line), Some(category), "{line}");
        }
    }
}
