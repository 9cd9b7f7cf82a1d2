"""The options come from the kernel's one schema: every `rlm.toml` key, `RLM_*` variable and
keyword works here as in the CLI (these tests are generated from the schema, so a new option
is covered the day it is added), and an `RLM` object builds its endpoints and ledger once."""

import json
import sys
from pathlib import Path

import pytest

import rlm_kernel
from rlm_kernel import RLM, _native

from conftest import repl, script

EVERY = _native.option_specs(every=True)
SECRET = "a-secret-value-of-some-length"


def toml_value(spec, value):
    """`value` (text) written as the TOML a user would write for this kind of option."""
    if spec["repeated"]:
        return f"[{json.dumps(value)}]"
    if spec["kind"] == "integer":
        return value
    if spec["kind"] == "number":
        return str(float(value))
    if spec["kind"] == "switch":
        return value
    return json.dumps(value)


def canonical(spec, value):
    """What the kernel makes of `value`: the form `RLM().options` shows."""
    return json.loads(_native.check_options(json.dumps({spec["name"]: value}), "test"))[spec["name"]]


@pytest.fixture
def fixtures(tmp_path, monkeypatch):
    """The files and variables the schema's examples name."""
    Path("file.md").write_text("Extra instructions.\n")
    monkeypatch.setenv("MY_VARIABLE", SECRET)


@pytest.mark.parametrize("spec", EVERY, ids=[s["name"] for s in EVERY])
def test_every_rlm_toml_key_works(spec, fixtures):
    Path("rlm.toml").write_text(f'[run]\n{spec["key"]} = {toml_value(spec, spec["example"])}\n')
    options = RLM().options
    if spec["used"]:
        if spec["kind"] == "path":
            # Relative to the file (here in the working directory).
            assert Path(options[spec["name"]]).resolve() == Path(spec["example"]).resolve()
        else:
            assert options[spec["name"]] == canonical(spec, spec["example"])
    else:
        # An option of the `rlm` command's own output: the shared file does not break the
        # package, which has no use for it.
        assert spec["name"] not in options


@pytest.mark.parametrize(
    "spec", [s for s in EVERY if s["env"]], ids=[s["name"] for s in EVERY if s["env"]]
)
def test_every_environment_variable_works(spec, fixtures, monkeypatch):
    monkeypatch.setenv(spec["env"], spec["example"])
    if spec["used"]:
        assert RLM().options[spec["name"]] == canonical(spec, spec["example"])
    else:
        # `rlm flow`'s run database (`RLM_DB`): set for the command, ignored by the package.
        assert spec["name"] not in RLM().options


USED = [s for s in EVERY if s["used"]]


@pytest.mark.parametrize("spec", USED, ids=[s["name"] for s in USED])
def test_every_keyword_takes_effect_in_a_run(spec, fixtures, mock_server, capfd):
    mock = mock_server(script([repl("print(llm_query('ping'))"), "FINAL(done)"]))
    # The models and URLs of the mock; `max_usd` needs a price to count by.
    value = {"model": "root", "sub_model": "sub"}.get(spec["name"], spec["example"])
    if spec["kind"] == "url":
        value = mock.base_url
    keywords = {"model": "root", "sub_model": "sub", "base_url": mock.base_url}
    if spec["name"] == "max_usd":
        keywords["price"] = "1:1"
    keywords[spec["name"]] = value
    rlm = RLM(**keywords)
    assert rlm.options[spec["name"]] == canonical(spec, value)
    result = rlm.completion("q", context="x")
    # Every option leaves the run working: an answer, or a limit the option itself set.
    assert result.termination_reason in ("final_answer", "token_budget", "max_iterations"), (
        spec["name"],
        result.error,
    )
    if spec["name"] == "trajectory":
        assert Path(value).read_text().count('"type":"iteration"') == 2
    if spec["name"] == "trace":
        err = capfd.readouterr().err
        assert "repl block" in err and "print(llm_query('ping'))" in err


def test_command_line_output_options_are_refused_as_keywords():
    for spec in [s for s in EVERY if not s["used"]]:
        name, why = spec["name"], "of the `rlm` command's output"
        if name in ("project_root", "allow_broad_root", "allow_hard_links"):
            why = "of the sandbox of `rlm agent`'s bundle tools"
        if name in ("db", "lease_expiry"):
            why = "of `rlm flow`'s run database"
        with pytest.raises(TypeError, match=f"`{name}` is an option {why}"):
            RLM(model="m", **{name: spec["example"]})


def test_values_are_checked_where_they_are_given(monkeypatch):
    with pytest.raises(ValueError, match="`cell_timeout` must be a positive number of seconds"):
        RLM(model="m", cell_timeout=-1)
    monkeypatch.setenv("RLM_CELL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="`RLM_CELL_TIMEOUT` must be a positive number"):
        RLM(model="m")
    monkeypatch.delenv("RLM_CELL_TIMEOUT")
    Path("rlm.toml").write_text('[run]\nsub-call-errors = "loud"\n')
    with pytest.raises(ValueError, match="`sub-call-errors` in `rlm.toml` must be one of `string`, `raise`"):
        RLM(model="m")
    Path("rlm.toml").write_text('[run]\nmax-iteratons = 3\n')
    with pytest.raises(RuntimeError, match="unknown option `max-iteratons` in `\\[run\\]`"):
        RLM(model="m")


def test_an_rlm_object_keeps_one_ledger_for_all_its_calls(mock_server):
    mock = mock_server(script(["FINAL(x)"]))
    rlm = RLM(model="sub", base_url=mock.base_url, max_sub_calls=2)
    assert rlm.llm_query("one") == "one"
    assert rlm.llm_query_batched(["two"]) == ["two"]
    # The third call finds the budget spent: one ledger across the object's calls.
    with pytest.raises(RuntimeError, match="Budget exhausted: 2 of 2 sub-calls used") as caught:
        rlm.llm_query("three")
    assert "Raise the budget with `max_sub_calls`" in str(caught.value)
    assert mock.requests == 2
    # A new object has a budget of its own.
    assert RLM(model="sub", base_url=mock.base_url, max_sub_calls=2).llm_query("four") == "four"


def test_module_level_calls_share_one_client_per_set_of_options(mock_server):
    mock = mock_server(script(["FINAL(x)"]))
    given = {"model": "sub", "base_url": mock.base_url, "max_sub_calls": 2}
    assert rlm_kernel.llm_query("one", **given) == "one"
    assert rlm_kernel.llm_query_batched(["two"], **given) == ["two"]
    # Not a new ledger per call: the budget of these options is spent.
    with pytest.raises(RuntimeError, match="Budget exhausted: 2 of 2 sub-calls used"):
        rlm_kernel.llm_query("three", **given)
    assert mock.requests == 2
    # Other effective options are another client, with a budget of its own; a session
    # default counts as the keyword would.
    assert rlm_kernel.llm_query("four", **dict(given, max_sub_calls=3)) == "four"
    rlm_kernel.configure(max_sub_calls=3)
    try:
        given.pop("max_sub_calls")
        # The same effective options as the call before: its client, one call used.
        answers = rlm_kernel.llm_query_batched(["five", "six", "seven"], **given)
    finally:
        rlm_kernel.configure(max_sub_calls=None)
    # The three are sent at once: any one of them finds the budget spent.
    refused = [a for a in answers if a.startswith("Error: Budget exhausted: 3 of 3 sub-calls used")]
    assert len(refused) == 1, answers
    assert [a for a in answers if a not in refused] == [
        p for p, a in zip(["five", "six", "seven"], answers) if a not in refused
    ], answers
    assert mock.requests == 5


def test_the_package_lists_the_options_of_the_schema():
    assert "sub_call_text_chars" in rlm_kernel.OPTIONS and "encoding" in rlm_kernel.OPTIONS
    assert "json" not in rlm_kernel.OPTIONS
    assert len(rlm_kernel.OPTIONS) == len(USED)
