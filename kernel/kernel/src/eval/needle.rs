//! The needle task (S-NIAH style): key–value facts hidden in a long distractor text; the
//! query asks for one key's value. With several needles the others are decoys with other keys.

use super::rng::SplitMix64;

/// How a fact starts: `The special magic number for KEY is: VALUE.`
pub const FACT_PREFIX: &str = "The special magic number for ";

const ADJECTIVES: &[&str] = &[
    "quiet", "ancient", "bright", "hollow", "gentle", "rapid", "distant", "golden", "narrow",
    "silent", "crimson", "broad", "frozen", "humble", "restless", "velvet",
];
const NOUNS: &[&str] = &[
    "river", "mountain", "village", "engine", "library", "harbour", "forest", "garden", "market",
    "bridge", "lantern", "orchard", "tower", "valley", "meadow", "workshop",
];
const VERBS: &[&str] = &[
    "follows",
    "shelters",
    "overlooks",
    "crosses",
    "remembers",
    "feeds",
    "guards",
    "outlasts",
    "echoes",
    "borders",
    "watches",
    "carries",
];
const ADVERBS: &[&str] = &[
    "slowly",
    "every spring",
    "without a sound",
    "at dawn",
    "as always",
    "in winter",
    "by design",
    "for years",
    "again",
    "at night",
];
const ANIMALS: &[&str] = &[
    "falcon", "otter", "badger", "heron", "lynx", "marten", "osprey", "walrus", "gecko", "ibis",
    "jackal", "puffin", "tapir", "vole", "wombat", "yak",
];

/// A needle instance: the text, the asked key and value, and the decoys' values.
pub(crate) struct Needle {
    pub(crate) context: String,
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) decoys: Vec<String>,
}

/// A distractor text of about `bytes` bytes with `needles` facts (≥ 1) at random lines; the
/// first fact is the one asked for.
pub(crate) fn generate(bytes: usize, needles: usize, rng: &mut SplitMix64) -> Needle {
    let mut lines: Vec<String> = Vec::new();
    let mut total = 0;
    while total < bytes {
        let mut line = String::new();
        for _ in 0..rng.between(3, 6) {
            line.push_str(&sentence(rng));
            line.push(' ');
        }
        line.pop();
        total += line.len() + 1;
        lines.push(line);
    }
    let mut facts: Vec<(String, String)> = Vec::new();
    while facts.len() < needles.max(1) {
        let key = format!("{}-{}", rng.pick(ADJECTIVES), rng.pick(ANIMALS));
        let value = rng.between(1_000_000, 9_999_999).to_string();
        if facts.iter().all(|(k, v)| *k != key && *v != value) {
            facts.push((key, value));
        }
    }
    for (key, value) in &facts {
        let at = rng.below(lines.len() + 1);
        lines.insert(at, format!("{FACT_PREFIX}{key} is: {value}."));
    }
    let mut context = lines.join("\n");
    context.push('\n');
    let mut facts = facts.into_iter();
    let (key, value) = facts.next().unwrap_or_default();
    Needle {
        context,
        key,
        value,
        decoys: facts.map(|(_, v)| v).collect(),
    }
}

fn sentence(rng: &mut SplitMix64) -> String {
    let mut s = format!(
        "the {} {} {} the {} {} {}.",
        rng.pick(ADJECTIVES),
        rng.pick(NOUNS),
        rng.pick(VERBS),
        rng.pick(ADJECTIVES),
        rng.pick(NOUNS),
        rng.pick(ADVERBS)
    );
    s[..1].make_ascii_uppercase();
    s
}

/// The query for `key`.
pub(crate) fn query(key: &str) -> String {
    format!(
        "Somewhere in the context is a sentence of the form `{FACT_PREFIX}KEY is: NUMBER.` \
         What is the special magic number for {key}? Answer with the number only."
    )
}

/// 1 when the answer names `value` and no other number: every run of digits in it (commas
/// and underscores between digits are separators) is `value`. Extra words around it are
/// fine; a second number (a decoy, a guess) is not.
pub(crate) fn score(answer: &str, value: &str) -> f64 {
    let mut runs: Vec<String> = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = answer.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let separator = (c == ',' || c == '_')
            && !current.is_empty()
            && chars.get(i + 1).is_some_and(char::is_ascii_digit);
        if c.is_ascii_digit() {
            current.push(c);
        } else if !separator && !current.is_empty() {
            runs.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    let right = !runs.is_empty() && runs.iter().all(|r| r == value);
    f64::from(u8::from(right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_checked_answers() {
        let v = "4821931";
        for (answer, expected) in [
            ("4821931", 1.0),
            ("  4821931\n", 1.0),
            ("The special magic number for quiet-otter is: 4821931.", 1.0),
            ("**4821931**", 1.0),
            ("4,821,931", 1.0),
            ("4821931 (I am sure: 4821931)", 1.0),
            ("", 0.0),
            ("I could not find it.", 0.0),
            ("48219310", 0.0),
            ("482193", 0.0),
            ("4821931 or 5550123", 0.0),
            ("Either 5550123, or 4821931", 0.0),
            ("4821932", 0.0),
        ] {
            assert_eq!(score(answer, v), expected, "{answer:?}");
        }
    }

    #[test]
    fn facts_are_in_the_text_once_and_the_decoys_differ() {
        let mut rng = SplitMix64::new(9);
        let n = generate(20_000, 3, &mut rng);
        assert!(
            (20_000..21_000).contains(&n.context.len()),
            "{}",
            n.context.len()
        );
        let fact = format!("{FACT_PREFIX}{} is: {}.", n.key, n.value);
        assert_eq!(n.context.matches(&fact).count(), 1);
        assert_eq!(n.context.matches(FACT_PREFIX).count(), 3);
        assert_eq!(n.decoys.len(), 2);
        assert!(!n.decoys.contains(&n.value));
        assert!(query(&n.key).contains(&format!("for {}?", n.key)));
    }
}
