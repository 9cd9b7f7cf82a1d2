//! A hook that prints the run as it goes: each reply's prose, each block with its output, and
//! the sub-calls it made. Used by `rlm demo`, on stderr.

use kernel::rlm::{BlockRun, Hook, ModelCall, extract_code_blocks, truncate_middle};

/// Lines of code or output shown per block before the middle is elided.
const SHOWN_CHARS: usize = 1_200;

#[derive(Debug, Default)]
pub(crate) struct TraceHook;

impl TraceHook {
    pub(crate) fn new() -> Self {
        Self
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  │ {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Hook for TraceHook {
    fn after_model_call(&mut self, call: &mut ModelCall) {
        // Replies with code: the prose around the blocks (the blocks print as they run).
        // Replies without: the whole text, which is what the model said.
        let shown = if extract_code_blocks(&call.reply).is_empty() {
            call.reply.trim().to_owned()
        } else {
            call.reply
                .split("```")
                .step_by(2)
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let label = if call.answer_now {
            "answer-now"
        } else {
            "iteration"
        };
        eprintln!("\n── {label} {} · root model ─────────────", call.iteration);
        if !shown.is_empty() {
            eprintln!("{}", truncate_middle(&shown, SHOWN_CHARS));
        }
    }

    fn after_block(&mut self, _iteration: u32, run: &mut BlockRun) {
        let r = &run.result;
        eprintln!("  ┌ repl block ({:.0} ms)", r.duration.as_secs_f64() * 1e3);
        eprintln!(
            "{}",
            indent(&truncate_middle(run.block.code.trim_end(), SHOWN_CHARS))
        );
        if !r.sub_calls.is_empty() {
            let failed = r.sub_calls.iter().filter(|c| c.error.is_some()).count();
            eprintln!(
                "  ├ {} sub-call(s) ({} llm_query, {} llm_query_batched), {failed} failed",
                r.sub_calls.len(),
                r.llm_query_calls,
                r.llm_query_batched_calls
            );
        }
        let out = r.stdout.trim_end();
        if !out.is_empty() {
            eprintln!("  ├ output");
            eprintln!("{}", indent(&truncate_middle(out, SHOWN_CHARS)));
        }
        let err = r.stderr.trim_end();
        if !err.is_empty() {
            eprintln!("  ├ stderr");
            eprintln!("{}", indent(&truncate_middle(err, SHOWN_CHARS)));
        }
        if let Some(answer) = r.final_answer() {
            eprintln!("  └ final answer set ({:?})", answer.source);
        } else {
            eprintln!("  └");
        }
    }
}
