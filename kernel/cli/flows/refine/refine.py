"""Deterministic steps of the `refine` workflow (no model)."""

import json


def save_inputs(state):
    """Marks the inputs saved once, for every later round.

    `rlm flow run refine` checks both inputs before the run starts: the agents' instructions
    need them, and nothing in this workflow writes them.
    """
    if state.get("inputs_saved"):
        return None
    return {"inputs_saved": True}


def save_document(state):
    """The last enriched template is the final document, however the loop ended."""
    document = state.get("enriched_template", "")
    updates = {"final_document": document, "__message__": document}
    if str(state.get("show_state", "")).lower() in ("1", "true", "yes"):
        shown = {k: v for k, v in sorted(state.items()) if not k.startswith("temp:")}
        updates["__message__"] = document + "\n\n--- state ---\n" + json.dumps(shown, indent=2)
    return updates
