"""Callbacks of the `rlm-completion` workflow's RLM agent."""


def inject_history(ctx):
    """Before each root call: earlier answers (of runs sharing a `--state FILE`) go into the
    first user message."""
    earlier = ctx["state"].get("user:answer_history") or []
    if not earlier:
        return None
    note = "\n\nEarlier answers (most recent last):\n" + "\n".join(
        f"- {item}" for item in earlier[-5:]
    )
    for message in ctx["request"]:
        if message["role"] == "user":
            if not message["content"].endswith(note):
                message["content"] += note
            break
    return None


def record_call(ctx):
    """After each root call: its size goes to `rlm_calls` (a list, one entry per call)."""
    calls = list(ctx["state"].get("rlm_calls") or [])
    calls.append({"reply_chars": len(ctx["response"])})
    ctx["state"]["rlm_calls"] = calls
    return None


def remember(ctx):
    """After the agent: its answer joins `user:answer_history` (kept across runs that share a
    `--state FILE`)."""
    answer = ctx["state"].get("raw_answer")
    if answer:
        history = list(ctx["state"].get("user:answer_history") or [])
        ctx["state"]["user:answer_history"] = (history + [answer])[-20:]
    return None
