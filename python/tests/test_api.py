"""The plain Python API against the mock LM server on 127.0.0.1."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest

import rlm_kernel
from rlm_kernel import RLM

from conftest import repl, script, sub_call_in_flight, wait_until


def test_completion_binds_a_live_frame_by_reference_and_answers(mock_server):
    # `isolation="none"`: the session is a namespace of this interpreter, so the frame is
    # the caller's own object (a worker process gets it through shared memory instead).
    df = pl.DataFrame({"region": ["n", "s", "n"], "sales": [3, 4, 5]})
    code = (
        f"print('same object:', id(context) == {id(df)})\n"
        "total = int(context['sales'].sum())\n"
        "print(type(context).__module__, context.height)"
    )
    mock = mock_server(script([repl(code), repl("FINAL_VAR(total)")]))
    result = RLM(
        model="root", sub_model="sub", base_url=mock.base_url, isolation="none"
    ).completion("Total sales?", context=df)
    assert result.answer == "12"
    assert result.termination_reason == "final_answer"
    assert result.metrics["iterations"] == 2
    stdout = result.trajectory[0]["blocks"][0]["stdout"]
    assert "same object: True" in stdout
    assert "polars.dataframe.frame 3" in stdout
    assert result.contexts[0]["kind"] == "table"
    assert result.contexts[0]["rows"] == 3
    # The root model was told what the frame is, by its shape, never its rows.
    first_prompt = mock.request_log()[0][1]
    assert "polars.DataFrame" in first_prompt and "3 rows" in first_prompt
    assert result.trajectory_jsonl.count('"type":"iteration"') == 2


def test_dicts_lists_and_text_are_live_too_and_paths_load(mock_server, tmp_path):
    data = {"a": [1, 2]}
    items = ["x", "y"]
    csv = tmp_path / "t.csv"
    csv.write_text("v\n1\n2\n")
    code = (
        f"print(id(context_0) == {id(data)}, id(context_1) == {id(items)})\n"
        "context_0['seen'] = True\n"
        "print(context_2, type(context_3).__name__)"
    )
    mock = mock_server(script([repl(code), "FINAL(ok)"]))
    result = RLM(model="root", base_url=mock.base_url, isolation="none").completion(
        "q", contexts=[data, items, "plain text", csv]
    )
    assert result.answer == "ok"
    assert result.trajectory[0]["blocks"][0]["stdout"] == "True True\nplain text DataFrame\n"
    # By reference: what the model's code does to the object, the caller sees.
    assert data["seen"] is True
    assert [c["kind"] for c in result.contexts] == ["json", "json", "text", "table"]


def test_the_model_namespace_is_not_the_callers(mock_server):
    code = "leaked = 1\nRLM = None\nglobals()['also_leaked'] = 2\nprint(__name__)"
    mock = mock_server(script([repl(code), "FINAL(done)"]))
    # In this interpreter (`none`), where a namespace could leak at all.
    RLM(model="root", base_url=mock.base_url, isolation="none").completion("q", context="text")
    assert "leaked" not in globals() and "also_leaked" not in globals()
    assert RLM is rlm_kernel.RLM
    import __main__

    assert not hasattr(__main__, "leaked")


def test_a_prompt_reaches_the_model_verbatim(mock_server):
    mock = mock_server(script(["FINAL(fine)"]))
    RLM(model="root", base_url=mock.base_url).completion("Is {'a': 1} a dict?", context="x")
    assert "Is {'a': 1} a dict?" in mock.request_log()[0][1]
    assert rlm_kernel.llm_query("{'a': 1}", model="sub", base_url=mock.base_url) == "{'a': 1}"


def test_eight_batched_sub_calls_run_in_parallel(mock_server):
    # Each call sleeps 2 s at the mock, so all eight overlap even when sending them is slow.
    mock = mock_server({"models": {"*": {"replies": [{"behaviour": "echo"}]}}}, latency_ms=2_000)
    prompts = [f"question {i}" for i in range(8)]
    answers = rlm_kernel.llm_query_batched(prompts, model="sub", base_url=mock.base_url)
    assert answers == prompts
    assert mock.max_concurrency() == 8, "the eight calls were not all in flight at once"


@pytest.fixture
def default_sigint():
    # Ctrl-C interrupts a run only under Python's default handler. A shell without job control
    # starts a background command with SIGINT ignored (POSIX), and Python keeps it ignored: a
    # test run started that way would see no interrupt. These tests press Ctrl-C as a user at
    # a terminal does, so they put the default handler in place (and back after).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_sigint_stops_a_run_in_a_slow_sub_call_with_its_partial_result(mock_server, default_sigint):
    code = "answer['content'] = 'partial'\nprint('calling')\nslow = llm_query('take your time')"
    sub_latency_s = 60
    mock = mock_server(script([repl(code), "FINAL(late)"], sub_latency_ms=sub_latency_s * 1000))
    rlm = RLM(model="root", sub_model="sub", base_url=mock.base_url)
    sent_at = []

    def interrupt_once_the_sub_call_is_in_flight():
        wait_until(lambda: sub_call_in_flight(mock), "the sub-call reached the mock")
        sent_at.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt_once_the_sub_call_is_in_flight)
    sender.start()
    with pytest.raises(KeyboardInterrupt) as caught:
        rlm.completion("q", context="x")
    stopped_after = time.monotonic() - sent_at[0]
    sender.join()
    # Not a speed check: stopping before half the sub-call's latency shows it was cancelled.
    assert stopped_after < sub_latency_s / 2, f"stopped {stopped_after:.2f}s after SIGINT"
    result = caught.value.result
    assert result.termination_reason == "interrupted"
    assert "interrupted" in str(caught.value)
    # The next run on the same process goes normally.
    fast = mock_server(script(["FINAL(next)"]))
    assert RLM(model="root", base_url=fast.base_url).completion("q", context="x").answer == "next"


def test_sigint_stops_the_run_even_when_code_on_the_main_thread_swallowed_it(mock_server, default_sigint):
    # CPython keeps one pending-signal bit per signal; Python code that runs on the main thread
    # while the run waits (a finalizer applied when the wait re-attaches, a progress callback)
    # runs the handler first, and a finalizer drops the KeyboardInterrupt it raised. Here a
    # finalizer run by the progress callback gets the SIGINT, sent to this very thread so that
    # it is handled inside the finalizer, deterministically. The run must stop all the same.
    sub_latency_s = 30
    code = "answer['content'] = 'partial'\nslow = llm_query('take your time')"
    mock = mock_server(script([repl(code), "FINAL(late)"], sub_latency_ms=sub_latency_s * 1000))
    sent_at = []

    class SwallowsTheInterrupt:
        def __del__(self):
            try:
                sent_at.append(time.monotonic())
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            except KeyboardInterrupt:
                pass

    def on_progress(event):
        if not sent_at:
            SwallowsTheInterrupt()  # dropped at once: its finalizer runs here

    rlm = RLM(model="root", sub_model="sub", base_url=mock.base_url)
    with pytest.raises(KeyboardInterrupt) as caught:
        rlm.completion("q", context="x", on_progress=on_progress)
    stopped_after = time.monotonic() - sent_at[0]
    assert stopped_after < sub_latency_s / 2, f"stopped {stopped_after:.2f}s after SIGINT"
    assert caught.value.result.termination_reason == "interrupted"
    assert "interrupted" in str(caught.value)
    # One press, one KeyboardInterrupt: nothing is pending for the next run.
    fast = mock_server(script(["FINAL(next)"]))
    assert RLM(model="root", base_url=fast.base_url).completion("q", context="x").answer == "next"


# A process of its own, so that the signal is a real Ctrl-C to a main thread with Python's
# default handler: it exports a context whose pickling waits, says so, and reports what the
# interrupt raised, then runs again on the same `RLM` object.
_CTRL_C_DURING_EXPORT = """
import json, signal, sys, time
from rlm_kernel import RLM, MockServer

# Python's own Ctrl-C, whatever this process inherited (a job started in the background
# inherits SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

class SlowToExport:
    def __reduce__(self):
        print("exporting", flush=True)
        time.sleep(60)
        return (dict, ())

mock = MockServer({"models": {"root": {"replies": ["FINAL(after)"]}}})
rlm = RLM(model="root", base_url=mock.base_url)
try:
    rlm.completion("q", context=SlowToExport())
    print("raised: nothing")
except BaseException as e:
    print("raised:", type(e).__name__, e, "| result:", getattr(e, "result", "missing"), flush=True)
print("next:", rlm.completion("q", context="x").answer, flush=True)
mock.close()
"""


def test_ctrl_c_while_a_context_is_handed_to_the_worker_raises_keyboard_interrupt(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_DURING_EXPORT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: "exporting\n" in lines or child.poll() is not None, "the export began")
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass  # Killed below; the assertions then say what it printed.
    finally:
        child.kill()
        child.wait()
    reader.join(timeout=10)
    stderr = child.stderr.read()
    said = "".join(lines)
    raised = next((line for line in lines if line.startswith("raised:")), said)
    assert raised.startswith("raised: KeyboardInterrupt"), f"{raised}\n{stderr}"
    assert "handing the context `context_0` to the worker" in raised, raised
    assert raised.endswith("| result: None\n"), raised
    assert "next: after\n" in lines, f"the object is not usable after the interrupt: {said}\n{stderr}"
    assert child.returncode == 0, stderr


def test_a_sigint_handler_of_the_users_own_decides_and_the_run_goes_on(mock_server):
    # Only the default handler means "interrupt": one that returns lets the run finish.
    code = "slow = llm_query('a moment')"
    mock = mock_server(script([repl(code), "FINAL(done)"], sub_latency_ms=1_000))
    handled = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: handled.append(signum))
    try:

        def on_progress(event):
            if not handled:
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)

        rlm = RLM(model="root", sub_model="sub", base_url=mock.base_url)
        result = rlm.completion("q", context="x", on_progress=on_progress)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert handled == [signal.SIGINT]
    assert result.answer == "done"
    assert result.termination_reason == "final_answer"


def test_bad_options_and_contexts_are_clear_errors(mock_server):
    with pytest.raises(TypeError, match="unknown option.*`max_iteration`.*max_iterations"):
        RLM(model="m", max_iteration=3)
    with pytest.raises(ValueError, match="`max_iterations` must be ≥ 1, got 0"):
        RLM(model="m", base_url="http://127.0.0.1:9/v1", max_iterations=0).completion("q", context="x")
    with pytest.raises(ValueError, match="No root model given"):
        RLM().completion("q", context="x")
    mock = mock_server(script(["FINAL(x)"]))
    with pytest.raises(RuntimeError, match="Context `context_0` is a `builtins.set`"):
        RLM(model="root", base_url=mock.base_url).completion("q", context={1, 2})


def test_environment_and_rlm_toml_fill_unset_options(mock_server, monkeypatch, tmp_path):
    mock = mock_server(script(["FINAL(from config)"]))
    Path("rlm.toml").write_text(f'[run]\nmodel = "root"\nbase-url = "{mock.base_url}"\nmax-iterations = 7\n')
    monkeypatch.setenv("RLM_MAX_ITERATIONS", "4")
    rlm = RLM()
    assert rlm.options["max_iterations"] == 4
    assert rlm.options["base_url"] == mock.base_url
    assert RLM(max_iterations=2).options["max_iterations"] == 2
    assert rlm.completion("q", context="x").answer == "from config"


def test_result_renders_answer_view_and_metrics(mock_server):
    mock = mock_server(script([repl("x = 40 + 2\nprint(x)"), "FINAL(42)"]))
    result = RLM(model="root", base_url=mock.base_url).completion("q", context="x")
    bundle = result._repr_mimebundle_()
    assert bundle["text/plain"] == "42"
    assert bundle["application/json"]["iterations"] == 2
    html = bundle["text/html"]
    assert html.startswith('<div class="rlm-view"') and "<details class=\"rlm-all\">" in html
    assert html.count('<details class="rlm-it">') == 2 and "x = 40 + 2" in html
    # The `reply` and `block` lines the run writes before each iteration are read, not skipped.
    assert "Skipped line" not in html
    # No price given: no cost, not a cost of 0.
    assert "<i>cost</i> no price given" in html and "$0.0000" not in html
    assert bundle["application/json"]["cost_usd"] is None


def test_batch_concurrency_takes_a_width_or_auto(mock_server, monkeypatch):
    mock = mock_server(script(["FINAL(x)"]))
    prompts = [f"item {i}" for i in range(40)]
    for width in (4, "auto", " Auto "):
        answers = rlm_kernel.llm_query_batched(
            prompts, model="sub", base_url=mock.base_url, batch_concurrency=width
        )
        assert answers == prompts
    monkeypatch.setenv("RLM_BATCH_CONCURRENCY", "auto")
    assert RLM().options["batch_concurrency"] == "auto"
    with pytest.raises(ValueError, match="`batch_concurrency` must be a whole number ≥ 1 or `auto`, got `wide`"):
        RLM(batch_concurrency="wide").options
    with pytest.raises(ValueError, match="must be a whole number ≥ 1 or `auto`"):
        rlm_kernel.llm_query_batched(prompts, model="sub", base_url=mock.base_url, batch_concurrency=0)


def test_isolated_runs_get_frames_text_and_objects_once_and_no_keys(mock_server, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-key-never-in-the-worker")
    frame = pl.DataFrame({"region": ["n", "s", "n"], "sales": [3, 4, 5]})
    table = pd.DataFrame({"v": [1.5, 2.5]}, index=["a", "b"])
    code = (
        "import os\n"
        f"print(os.getpid() != {os.getpid()}, 'OPENAI_API_KEY' in os.environ)\n"
        "print(type(context_0).__module__, int(context_0['sales'].sum()))\n"
        "print(type(context_1).__name__, list(context_1.index), float(context_1['v'].sum()))\n"
        "print(context_2, context_3, context_4)\n"
        "context_2['seen'] = True"
    )
    mock = mock_server(script([repl(code), "FINAL(ok)"]))
    data = {"a": [1, 2]}
    result = RLM(model="root", base_url=mock.base_url).completion(
        "q", contexts=[frame, table, data, "plain text", b"bytes text"]
    )
    assert result.answer == "ok", result.trajectory
    assert result.trajectory[0]["blocks"][0]["stdout"] == (
        "True False\n"
        "polars.dataframe.frame 12\n"
        "DataFrame ['a', 'b'] 4.0\n"
        "{'a': [1, 2]} plain text bytes text\n"
    )
    # A copy, not the caller's object: the worker's change stays there.
    assert "seen" not in data
    assert [c["kind"] for c in result.contexts] == ["table", "table", "json", "text", "text"]


def test_an_isolated_run_survives_a_segfault_with_its_variables(mock_server):
    crash = "import ctypes\nctypes.string_at(0)"
    answer = "answer_text = f'{x + 1} {r}'\nFINAL_VAR(answer_text)"
    mock = mock_server(
        script([repl("x = 41\nr = llm_query('remembered')"), repl(crash), repl(answer)])
    )
    result = RLM(model="root", sub_model="sub", base_url=mock.base_url).completion(
        "q", context="x"
    )
    assert result.answer == "42 remembered"
    crashed = result.trajectory[1]["blocks"][0]
    assert crashed["error"]["type_name"] == "WorkerCrashed"
    assert crashed["restart"]["restore"]["kind"] == "replayed"
    assert [m for m, _ in mock.request_log()].count("sub") == 1, "no sub-call sent again"


def test_a_completion_returns_once_its_session_is_closed(mock_server):
    # The model's code writes a file to its worker's scratch directory, which goes with the
    # session: when the call returns, the worker has ended and the folder is gone, so a
    # notebook's next cell does not race the close (before, it was still there every time).
    code = (
        "import os\n"
        "open(os.path.join(os.environ['SCRATCH'], 'left.txt'), 'w').write('x')\n"
        "print(os.environ['SCRATCH'])"
    )
    for _ in range(3):
        mock = mock_server(script([repl(code), "FINAL(ok)"]))
        rlm = RLM(model="root", base_url=mock.base_url)
        result = rlm.completion("q", context="text")
        assert result.answer == "ok"
        scratch = result.trajectory[0]["blocks"][0]["stdout"].strip()
        assert scratch.startswith("/"), result.trajectory[0]["blocks"][0]
        assert not os.path.exists(scratch), f"{scratch} is still there: the session was closing"


def test_max_depth_gives_the_code_rlm_query_children_and_the_tree_in_the_result(mock_server):
    # `sub` plays each child RLM (recognised by the RLM system prompt): it counts `x` in its
    # context in one block, then answers with the count.
    children = (
        "parts = ['x x', 'x', '']\n"
        "answers = rlm_query_batched(['How many x?'] * 3, parts)\n"
        "total = sum(int(a) for a in answers)"
    )
    sub = {
        "rules": [
            {"system": "recursive language model", "turn": 0,
             "reply": repl("n = str(context).count('x')")},
            {"system": "recursive language model", "turn": 1, "reply": "FINAL_VAR(n)"},
        ],
        "fallback": {"behaviour": "echo"},
    }
    mock = mock_server({"models": {"root": {"replies": [repl(children), "FINAL_VAR(total)"]},
                                   "sub": sub}})
    options = dict(model="root", sub_model="sub", base_url=mock.base_url, isolation="none")
    deep = RLM(max_depth=2, **options).completion("Count x")
    assert deep.answer == "3"
    assert deep.metrics["child_runs"] == 3
    nodes = deep.trajectory[0]["blocks"][0]["children"]
    assert [(n["depth"], n["answer"]) for n in nodes] == [(1, "2"), (1, "1"), (1, "0")]
    # At the default depth, rlm_query is llm_query: `sub` echoes, and the sum fails.
    flat = RLM(**options).completion("Count x")
    assert "children" not in flat.trajectory[0]["blocks"][0] or not flat.trajectory[0]["blocks"][0]["children"]
    assert "runs as llm_query()" in flat.trajectory[0]["blocks"][0]["stderr"]
    with pytest.raises(ValueError, match="max_depth"):
        RLM(max_depth=0, **options)
