"""`%load_ext rlm_kernel` and `%%rlm` in a real Jupyter kernel (ipykernel), driven headlessly."""

import time

import nbformat
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient

from conftest import repl, script, sub_call_in_flight, wait_until

# The slow sub-call's latency: an interrupt must end the cell long before it.
SUB_LATENCY_S = 60


class RecordingClient(NotebookClient):
    """Keeps the type of every IOPub message, per cell (nbclient folds display updates into
    the earlier output, so the outputs alone cannot show them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.messages = {}

    def process_message(self, msg, cell, cell_index):
        self.messages.setdefault(cell_index, []).append(msg["msg_type"])
        return super().process_message(msg, cell, cell_index)


def test_rlm_magic_over_a_polars_frame(mock_server):
    code = "total = int(context['sales'].sum())\nprint(total)"
    # Root replies take a while, so the live progress display is updated as the run goes.
    mock = mock_server(script([repl(code), repl("FINAL_VAR(total)")], root_latency_ms=300))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "%load_ext rlm_kernel\nimport polars as pl\n"
            "df = pl.DataFrame({'region': ['n', 's', 'n'], 'sales': [3, 4, 5]})"
        ),
        nbformat.v4.new_code_cell(f"%rlm_config --model root --sub-model sub --base-url {mock.base_url}"),
        nbformat.v4.new_code_cell("%%rlm -c df -o ans --max-iterations 5\nTotal sales? Reply like {'a': 1}."),
        nbformat.v4.new_code_cell(
            "import json\n"
            "print(type(ans).__name__, ans.answer, ans.termination_reason)\n"
            "print(json.loads(ans.trajectory_jsonl.splitlines()[0])['query'])\n"
            "df.height"
        ),
    ]
    client = RecordingClient(nb, timeout=120, kernel_name="python3")
    client.execute()

    magic = nb.cells[2]
    kinds = [o["output_type"] for o in magic.outputs]
    assert "display_data" in kinds, magic.outputs
    assert "update_display_data" in client.messages[2], client.messages[2]
    result = next(o for o in magic.outputs if o["output_type"] == "execute_result")
    assert result["data"]["text/plain"] == "12"
    assert '<details class="rlm-all">' in result["data"]["text/html"]
    assert "Skipped line" not in result["data"]["text/html"]
    assert "no price given" in result["data"]["text/html"]
    assert result["data"]["application/json"]["iterations"] == 2
    progress = next(o for o in magic.outputs if o["output_type"] == "display_data")
    assert "iteration" in progress["data"]["text/plain"]
    assert "no price given" in progress["data"]["text/plain"], progress["data"]["text/plain"]
    assert "$0.0000" not in progress["data"]["text/plain"]

    check = nb.cells[3]
    # The cell body is the query, verbatim (no `{}` expansion); `test_api` checks that a
    # query reaches the model as given.
    assert check.outputs[0]["text"] == (
        "RLMResult 12 final_answer\nTotal sales? Reply like {'a': 1}.\n"
    )
    # The notebook's own variable is untouched.
    assert check.outputs[1]["data"]["text/plain"] == "3"


def _execute(client, code, timeout=60):
    msg_id = client.execute(code)
    reply = client.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=timeout)
    return reply["content"]


def test_interrupting_the_kernel_stops_a_slow_sub_call_and_the_next_cell_runs(mock_server):
    code = "print('asking')\nslow = llm_query('take your time')"
    mock = mock_server(script([repl(code), "FINAL(late)"], sub_latency_ms=SUB_LATENCY_S * 1000))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = _execute(kc, f"%load_ext rlm_kernel\n%rlm_config --model root --sub-model sub --base-url {mock.base_url}")
        assert setup["status"] == "ok", setup
        # `stop_on_error=False`: after an error reply ipykernel aborts the execute requests that
        # reach it before it posts itself a "stop aborting" message, so a next cell sent the
        # moment the reply arrives was sometimes `aborted` on a loaded machine. That is
        # ipykernel's queue handling, not the kernel's state, which the next cell checks.
        msg_id = kc.execute("%%rlm\nTake your time.", stop_on_error=False)
        # Interrupt only once the slow sub-call has reached the mock (evidence, not a sleep).
        wait_until(lambda: sub_call_in_flight(mock), "the sub-call reached the mock")
        interrupted_at = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=SUB_LATENCY_S)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=SUB_LATENCY_S)
        took = time.monotonic() - interrupted_at
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        # Not a speed check: answering before half the sub-call's latency shows the call was
        # cancelled rather than waited out, whatever the machine's load.
        assert took < SUB_LATENCY_S / 2, f"the interrupt took {took:.2f}s"
        after = _execute(kc, "21 * 2")
        assert after["status"] == "ok", after
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_interrupting_the_kernel_stops_a_block_stuck_in_c_code_with_its_worker(mock_server):
    # A C-level sleep never returns to the interpreter, so no KeyboardInterrupt can land in
    # it: the block's worker process must be ended instead (isolation="process", the default).
    code = f"print(llm_query('ready'))\nimport ctypes\nctypes.CDLL(None).sleep({SUB_LATENCY_S})"
    mock = mock_server(script([repl(code), "FINAL(late)"]))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = _execute(kc, f"%load_ext rlm_kernel\n%rlm_config --model root --sub-model sub --base-url {mock.base_url}")
        assert setup["status"] == "ok", setup
        msg_id = kc.execute("%%rlm\nSleep in C.", stop_on_error=False)
        # The root reply and the block's sub-call are answered: the block is at its C sleep.
        wait_until(lambda: mock.requests >= 2, "the block's sub-call was answered")
        interrupted_at = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=SUB_LATENCY_S)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=SUB_LATENCY_S)
        took = time.monotonic() - interrupted_at
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        # Not a speed check: well before the sleep's end shows the worker was ended rather
        # than the sleep waited out, whatever the machine's load.
        assert took < SUB_LATENCY_S / 2, f"the interrupt took {took:.2f}s"
        after = _execute(kc, "21 * 2")
        assert after["status"] == "ok", after
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_segfaulting_cell_leaves_the_kernel_alive_and_the_session_restored(mock_server):
    crash = "import ctypes\nctypes.string_at(0)"
    answer = "answer_text = f'{total + 1}'\nFINAL_VAR(answer_text)"
    mock = mock_server(script([repl("total = int(context['sales'].sum())"), repl(crash), repl(answer)]))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        setup = _execute(
            kc,
            "%load_ext rlm_kernel\nimport os, polars as pl\n"
            "df = pl.DataFrame({'sales': [3, 4, 5]})\nkernel_pid = os.getpid()\n"
            f"%rlm_config --model root --sub-model sub --base-url {mock.base_url}",
        )
        assert setup["status"] == "ok", setup
        ran = _execute(kc, "%%rlm -c df -o ans\nTotal sales plus one?", timeout=120)
        assert ran["status"] == "ok", ran
        # The kernel is the same process, and the run answered from the restored variable.
        check = _execute(
            kc,
            "assert os.getpid() == kernel_pid\n"
            "crashed = ans.trajectory[1]['blocks'][0]\n"
            "assert ans.answer == '13', ans.answer\n"
            "assert crashed['error']['type_name'] == 'WorkerCrashed', crashed\n"
            "assert crashed['restart']['restore']['kind'] == 'replayed', crashed",
        )
        assert check["status"] == "ok", check
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
