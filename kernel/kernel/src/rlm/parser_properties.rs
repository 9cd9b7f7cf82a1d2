//! Property tests of the reply parsers ([`extract_code_blocks`], [`scan_final_lines`],
//! [`check_completion`]): whatever a model sends, they never panic, never do more than linear
//! work, and never call a reply final without a final-answer line or code.
//!
//! Replies are drawn from arbitrary Unicode text and from "token soups" of the characters the
//! parsers care about (fences, `FINAL(`, parentheses, quotes, newlines). The seed is fixed so a
//! failure reproduces; `PROPTEST_CASES` raises the number of cases. Run with `--no-capture` to
//! see the executions and the worst time per MB on adversarial 1 MB replies. Linear time is
//! asserted by counting the bytes the scans examine, never by timing; the output shows the time
//! per MB at 100 KB and at 1 MB side by side. The code blocks are matched by hand: they must be
//! the matches the `regex` crate finds for the same pattern, whatever the reply.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use super::blocks::{extract_code_blocks, extract_counting, prose_outside_blocks};
use super::final_answer::{
    CodeAndFinal, CompletionRules, FinalText, Protocol, ReplyCode, check_completion, scan_counting,
    scan_final_lines,
};

/// The pieces that matter to the parsers, and some that do not.
const TOKENS: &[&str] = &[
    "```repl\n",
    "```repl",
    "```",
    "\n```",
    "```python\n",
    "\n",
    "\r\n",
    "FINAL(",
    "FINAL_VAR(",
    "FINAL",
    "(",
    ")",
    "\"",
    "'",
    "`",
    "\\",
    " ",
    "\t",
    "x",
    "42",
    "answer",
    "é",
    "🦀",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..200).prop_map(|t| t.concat())
}

/// A token soup in which no `FINAL` can form.
fn prose_soup() -> impl Strategy<Value = String> {
    let tokens: Vec<&str> = TOKENS
        .iter()
        .copied()
        .filter(|t| !t.contains("FINAL"))
        .collect();
    prop::collection::vec(prop::sample::select(tokens), 0..200).prop_map(|t| t.concat())
}

/// Replies made of tags, fences and whitespace only (Unicode's too): where the pattern gives
/// back whitespace to close a block.
fn fence_soup() -> impl Strategy<Value = String> {
    const PIECES: &[&str] = &[
        "```repl", "```", "`", "\n", " ", "\t", "\r", "\u{a0}", "\u{2028}", "x", "repl",
    ];
    prop::collection::vec(prop::sample::select(PIECES), 0..40).prop_map(|t| t.concat())
}

fn any_reply() -> impl Strategy<Value = String> {
    prop_oneof![token_soup(), any::<String>()]
}

/// Runs `test` on `cases` replies from `strategy`; returns how many ran.
fn check<S: Strategy>(
    strategy: S,
    cases: u32,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> u32 {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    let mut runner = TestRunner::new_with_rng(config, rng);
    if let Err(failure) = runner.run(&strategy, test) {
        panic!("{failure}");
    }
    cases
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// Whether some line outside `repl` blocks starts (after whitespace) with `FINAL(` or
/// `FINAL_VAR(` — what a reply needs, besides code, to be final.
fn has_final_line(reply: &str) -> bool {
    reply.lines().any(|line| {
        let line = line.trim_start();
        line.starts_with("FINAL(") || line.starts_with("FINAL_VAR(")
    })
}

/// Every rule set there is.
fn all_rules() -> Vec<CompletionRules> {
    let mut rules = Vec::new();
    for protocol in [Protocol::Auto, Protocol::Final, Protocol::Answer] {
        for code_and_final in [
            CodeAndFinal::AcceptUnlessError,
            CodeAndFinal::SeeOutputFirst,
            CodeAndFinal::Accept,
        ] {
            rules.push(CompletionRules {
                protocol,
                code_and_final,
            });
        }
    }
    rules
}

#[test]
fn parsers_hold_their_properties_on_any_reply() {
    let n = cases();
    let mut executions = 0;

    // No panic, linear work, and blocks that are really in the reply.
    executions += check(any_reply(), n, |reply| {
        let mut work = 0;
        let lines = scan_counting(&reply, &mut work);
        prop_assert_eq!(&lines, &scan_final_lines(&reply));
        prop_assert!(
            work <= 3 * reply.len() + 3,
            "work {} for {} bytes",
            work,
            reply.len()
        );
        let mut block_work = 0;
        let blocks = extract_counting(&reply, &mut block_work);
        prop_assert!(
            block_work <= 3 * reply.len() + 3,
            "block search {} for {} bytes",
            block_work,
            reply.len()
        );
        prop_assert!(blocks.len() <= reply.matches("```repl").count());
        for (i, block) in blocks.iter().enumerate() {
            prop_assert_eq!(block.index, i);
            prop_assert!(reply.contains(&block.code));
        }
        Ok(())
    });

    // The blocks are the pattern's matches, as a regex engine finds them.
    let pattern = regex::Regex::new(r"(?s)```repl\s*\n(.*?)\n```").expect("the pattern");
    for strategy in [any_reply().boxed(), fence_soup().boxed()] {
        executions += check(strategy, n, |reply| {
            let codes: Vec<String> = extract_code_blocks(&reply)
                .into_iter()
                .map(|b| b.code)
                .collect();
            let matched: Vec<String> = pattern
                .captures_iter(&reply)
                .map(|c| c.get(1).map_or("", |m| m.as_str()).to_owned())
                .collect();
            prop_assert_eq!(codes, matched, "reply: {:?}", &reply);
            prop_assert_eq!(
                prose_outside_blocks(&reply),
                pattern.replace_all(&reply, "\n").into_owned(),
                "reply: {:?}",
                &reply
            );
            Ok(())
        });
    }

    // Never final without a final-answer line or code, whatever the rules and the namespace.
    executions += check(any_reply(), n, |reply| {
        if has_final_line(&reply) || !extract_code_blocks(&reply).is_empty() {
            return Ok(());
        }
        for rules in all_rules() {
            let done = check_completion(&reply, ReplyCode::NoBlocks, &[], rules, &mut |_| {
                Some("a value".to_owned())
            });
            prop_assert_eq!(done.answer, None);
            prop_assert_eq!(done.candidate, None);
        }
        Ok(())
    });

    // A FINAL line that ends the reply gives its argument, after any prose without FINAL.
    let argument = "[a-z0-9 ,.]{0,20}(\\([a-z ]{0,8}\\))?[a-z0-9 ]{0,8}";
    executions += check((prose_soup(), argument), n, |(prose, argument)| {
        let reply = format!("{prose}\nFINAL({argument})\n");
        let lines = scan_final_lines(&reply);
        // Prose with an open `repl` fence turns the line into code.
        if extract_code_blocks(&reply).is_empty() {
            prop_assert_eq!(
                lines.final_text,
                Some(FinalText::Closed(argument.trim().to_owned()))
            );
        }
        Ok(())
    });

    // ... and text after its closing parenthesis makes it prose.
    executions += check(
        (prose_soup(), argument, "[a-z.!]{1,5}"),
        n,
        |(prose, argument, after)| {
            let reply = format!("{prose}\nFINAL({argument}) {after}");
            prop_assert_eq!(scan_final_lines(&reply).final_text, None);
            Ok(())
        },
    );

    println!("parser properties: {executions} executions");
}

/// Adversarial replies of about `size` bytes.
fn adversarial(size: usize) -> Vec<(&'static str, String)> {
    let fill = |unit: &str| unit.repeat(size / unit.len());
    let nested = {
        let k = size / 8;
        format!("{}{}", "FINAL(\n".repeat(k), ")x".repeat(k))
    };
    vec![
        ("unclosed repl fences", fill("```repl\n")),
        ("closed repl blocks", fill("```repl\nx\n```\n")),
        ("repl fences never closed", fill("```repl\na")),
        (
            "whitespace after one fence",
            format!("```repl{}", " \n".repeat(size / 2)),
        ),
        (
            "one FINAL with unclosed parentheses",
            format!("FINAL({}", "(".repeat(size)),
        ),
        ("FINAL lines with unclosed parentheses", fill("FINAL((\n")),
        ("FINAL lines with text after them", fill("FINAL(a) b\n")),
        ("FINAL lines with stray quotes", fill("FINAL(\") x\n")),
        ("nested rejected FINAL lines", nested),
        (
            "an unclosed FINAL_VAR",
            format!("FINAL_VAR({}", "x".repeat(size)),
        ),
        ("fences and FINAL lines", fill("```repl\nFINAL(\n```\n)(\"")),
    ]
}

/// Time of the three parsers on `reply` (one run: in a debug build 1 MB takes seconds).
fn parse_time(reply: &str) -> Duration {
    let started = Instant::now();
    let blocks = extract_code_blocks(reply);
    let lines = scan_final_lines(reply);
    let done = check_completion(
        reply,
        ReplyCode::NoBlocks,
        &[],
        CompletionRules::default(),
        &mut |_| None,
    );
    std::hint::black_box((blocks, lines, done));
    started.elapsed()
}

#[test]
fn adversarial_megabyte_replies_parse_in_linear_work() {
    const MB: usize = 1 << 20;
    let mut worst = Duration::ZERO;
    let small = adversarial(MB / 10);
    for ((name, reply), (_, tenth)) in adversarial(MB).into_iter().zip(small) {
        // Counted, not timed: the FINAL scan and the blocks' search each examine each byte at
        // most three times.
        let (mut work, mut block_work) = (0, 0);
        scan_counting(&reply, &mut work);
        extract_counting(&reply, &mut block_work);
        for (examined, by) in [(work, "the FINAL scan"), (block_work, "the blocks' search")] {
            assert!(
                examined <= 3 * reply.len() + 3,
                "{name}: {examined} bytes examined by {by} in {} bytes",
                reply.len()
            );
        }
        let per_mb = |text: &str| parse_time(text).mul_f64(MB as f64 / text.len() as f64);
        let (at_1mb, at_100kb) = (per_mb(&reply), per_mb(&tenth));
        worst = worst.max(at_1mb);
        println!(
            "{name}: scan work {:.2}, block search {:.2} per byte; {:.1} ms per MB at 1 MB, {:.1} at 100 KB",
            work as f64 / reply.len() as f64,
            block_work as f64 / reply.len() as f64,
            at_1mb.as_secs_f64() * 1000.0,
            at_100kb.as_secs_f64() * 1000.0,
        );
    }
    println!(
        "worst time per MB over the adversarial 1 MB replies: {:.1} ms",
        worst.as_secs_f64() * 1000.0
    );
}
