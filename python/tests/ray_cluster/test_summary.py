"""The summary a list's job ends with (`rlm_kernel.ray._rows.job_summary`, `warn_summary`): the
rows that failed and the rows whose sub-calls failed, counted and named, from a serial run and
from result rows alike, and handed back as the result's `summary` (`JobResults`, a list still); no cluster needed."""

import copy
import json
import logging
import pickle

from rlm_kernel import MockServer
from rlm_kernel.ray import JobResults, map_completions, summarize
from rlm_kernel.ray._rows import NAMED_ROWS, job_summary, warn_summary

from conftest import repl

#: A row's sub-call: its context as the prompt, too long for the sub-model's window in row 1.
SCRIPT = {
    "models": {
        "root": {"replies": [repl("r = llm_query(context)\nprint(r)"), "FINAL_VAR(r)"]},
        "sub": {"replies": [{"behaviour": "echo"}]},
    }
}


def test_a_job_names_the_rows_whose_sub_calls_failed_though_their_error_is_none(caplog):
    caplog.set_level(logging.WARNING, logger="rlm_kernel.ray")
    contexts = ["short", "long " * 3000, "also short", "word " * 3000]
    # And a row that fails outright: its query is not text.
    given = [{"query": "Echo the context.", "context": c} for c in contexts]
    given.append({"query": 42, "context": "short"})
    with MockServer(SCRIPT) as mock:
        results = map_completions(
            given, serial=True, model="root", sub_model="sub", base_url=mock.base_url,
            sub_context_window=2000,
        )
    # The failed sub-call's error string became the answer; the row itself did not fail.
    assert [r["error"] for r in results[:4]] == [None] * 4, results
    assert [r["metrics"]["sub_call_errors"] for r in results[:4]] == [0, 1, 0, 1], results
    assert "does not fit `sub`'s 2k window" in results[1]["answer"], results[1]
    assert results[4]["error"] == "RowError: The query must be a `str`, not `int`", results[4]
    summary = job_summary(results)
    assert (summary["rows"], summary["rows_failed"], summary["failed_rows"]) == (5, 1, [4]), summary
    assert (summary["rows_failed_sub_calls"], summary["failed_sub_call_rows"]) == (2, [1, 3]), summary
    # The caller gets the same counts as data, with the rows; `summarize` counts a list alike.
    assert results.summary == summary == summarize(list(results)), results.summary
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "1 of 5 rows failed: rows 4; each row's `error` says why",
        "2 of 5 rows had sub-calls that failed (their code got an error string instead of an "
        "answer, so their answer may be wrong even without an `error`): rows 1, 3; "
        '`metrics["sub_call_errors"]` counts each row\'s',
    ], caplog.text


def row(sub_call_errors):
    return {"error": None, "metrics": {"sub_call_errors": sub_call_errors}}


def test_the_summary_names_the_first_rows_only_and_keeps_the_gates_counts(caplog):
    caplog.set_level(logging.WARNING, logger="rlm_kernel.ray")
    failing = list(range(3, 3 + 3 * (NAMED_ROWS + 5), 3))  # NAMED_ROWS + 5 rows' sub-calls fail
    results = [row(2 if i in failing else 0) for i in range(100)]
    results[0] = {"error": "RowError: no query", "metrics": None}  # failed before running
    stopped = list(range(1, 1 + 3 * (NAMED_ROWS + 1), 3))  # and NAMED_ROWS + 1 runs failed
    for i in stopped:
        results[i] = {"error": "BudgetError: 1 of 1 sub-calls used", "metrics": {}}
    results[stopped[0]]["metrics"]["sub_call_errors"] = 1  # counted as both
    gate = {"rows": 100, "rows_retried": 4, "retries": 9, "pauses": 2, "lowest_width": 8,
            "ceiling": 32}
    summary = job_summary(results, gate)
    assert summary["rows_failed"] == NAMED_ROWS + 2, summary
    assert summary["failed_rows"] == ([0] + stopped)[:NAMED_ROWS], summary
    assert summary["rows_failed_sub_calls"] == NAMED_ROWS + 6, summary
    assert summary["failed_sub_call_rows"] == sorted([1] + failing)[:NAMED_ROWS], summary
    assert (summary["rows_retried"], summary["retries"]) == (4, 9), summary
    warn_summary(summary)
    said = caplog.text
    named = ", ".join(map(str, ([0] + stopped)[:NAMED_ROWS]))
    assert f"{NAMED_ROWS + 2} of 100 rows failed: rows {named} and 2 more;" in said, said
    named = ", ".join(map(str, sorted([1] + failing)[:NAMED_ROWS]))
    assert f"{NAMED_ROWS + 6} of 100 rows had sub-calls that failed" in said, said
    assert f"rows {named} and 6 more;" in said, said
    assert "4 of 100 rows had calls retried" in said and "went down to 8 (of 32)" in said, said


def test_a_job_without_failed_sub_calls_or_retries_warns_of_nothing(caplog):
    caplog.set_level(logging.DEBUG, logger="rlm_kernel.ray")
    summary = job_summary([row(0), row(0)], None)  # no gate answered: its counts are absent
    assert summary == {"rows": 2, "rows_failed": 0, "failed_rows": [], "rows_failed_sub_calls": 0,
                       "failed_sub_call_rows": []}
    warn_summary(summary)
    assert caplog.records == []


def test_the_results_are_a_list_that_carries_the_jobs_summary():
    with MockServer(SCRIPT) as mock:
        options = dict(serial=True, model="root", sub_model="sub", base_url=mock.base_url,
                       sub_context_window=2000)
        results = map_completions(
            [{"query": "Echo.", "context": c} for c in ("a", "b " * 6000)], **options
        )
        empty = map_completions([], **options)
    plain = [dict(r) for r in results]
    # A list to every caller that takes one.
    assert isinstance(results, list) and isinstance(results, JobResults)
    assert results == plain and len(results) == 2 and results[-1] == plain[-1]
    assert json.loads(json.dumps(results)) == json.loads(json.dumps(plain))
    assert results.summary == {"rows": 2, "rows_failed": 0, "failed_rows": [],
                               "rows_failed_sub_calls": 1, "failed_sub_call_rows": [1]}
    # The summary survives what carries a result elsewhere (a Ray object, a cache, a copy).
    for carried in (pickle.loads(pickle.dumps(results)), copy.copy(results), copy.deepcopy(results)):
        assert type(carried) is JobResults and carried == plain, carried
        assert carried.summary == results.summary, carried.summary
    assert empty == [] and empty.summary == {"rows": 0, "rows_failed": 0, "failed_rows": [],
                                             "rows_failed_sub_calls": 0, "failed_sub_call_rows": []}


def test_summarize_takes_result_rows_only():
    assert summarize((row(0), row(3), {"error": "RowError: no query", "metrics": None})) == {
        "rows": 3, "rows_failed": 1, "failed_rows": [2], "rows_failed_sub_calls": 1,
        "failed_sub_call_rows": [1]}
    try:
        summarize({"rows": 2})
    except TypeError as error:
        assert "takes the result rows of `map_completions`" in str(error), error
    else:
        raise AssertionError("a dict is not result rows")
