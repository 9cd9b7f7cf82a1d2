"""The trajectory view (`rlm view`, the notebook's `text/html`) in a real headless Chromium."""

import re
import subprocess

from rlm_kernel import RLM

from conftest import chromium, repl, rlm_binary, script


def _browse(url, tmp_path, *extra):
    """Loads `url` in headless Chromium; returns (stdout, console messages)."""
    run = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    return run.stdout, console


def _run_with_trajectory(mock_server, tmp_path):
    replies = [
        repl("rows = context.splitlines()\nprint(len(rows), 'rows <b>not bold</b>')"),
        repl("needle = [r for r in rows if 'needle' in r]\n1 / 0"),
        repl("answer['content'] = needle[0]\nanswer['ready'] = True"),
    ]
    mock = mock_server(script(replies))
    trajectory = tmp_path / "run.jsonl"
    result = RLM(model="root", base_url=mock.base_url, trajectory=trajectory).completion(
        "Find the needle", context="hay\nhay\nthe needle line\nhay"
    )
    assert result.answer == "the needle line"
    return trajectory


def test_rlm_view_page_renders_in_chromium_searchable_without_console_errors(
    mock_server, tmp_path
):
    trajectory = _run_with_trajectory(mock_server, tmp_path)
    page = tmp_path / "run.html"
    subprocess.run([rlm_binary(), "view", trajectory, "-o", page], check=True, timeout=60)

    dom, console = _browse(page.as_uri(), tmp_path, "--dump-dom")
    assert console == []
    assert len(re.findall(r'<details class="rlm-it"', dom)) == 3
    assert re.search(r'<pre class="rlm-answer">the needle line</pre>', dom)
    assert "Find the needle" in dom
    assert "ZeroDivisionError" in dom
    # Model output is text, never markup.
    assert "4 rows &lt;b&gt;not bold&lt;/b&gt;" in dom

    # The search box (prefilled from the link) keeps only the iterations that match.
    dom, console = _browse(page.as_uri() + "#search=ZeroDivision", tmp_path, "--dump-dom")
    assert console == []
    assert '<span class="rlm-count">1 of 3 iterations match</span>' in dom
    assert len(re.findall(r'<details class="rlm-it rlm-hidden"', dom)) == 2
    assert len(re.findall(r'<details class="rlm-it" open=""', dom)) == 1

    shot = tmp_path / "view.png"
    _browse(page.as_uri(), tmp_path, f"--screenshot={shot}", "--window-size=1000,800")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_notebook_fragment_renders_collapsed_in_chromium(mock_server, tmp_path):
    mock = mock_server(script([repl("print(40 + 2)"), "FINAL(42)"]))
    result = RLM(model="root", base_url=mock.base_url).completion("q", context="x")
    page = tmp_path / "fragment.html"
    # Two results on one page (as in a notebook): each view's script finds its own parts.
    page.write_text(
        "<!DOCTYPE html><html><body>"
        + result._repr_mimebundle_()["text/html"]
        + result._repr_mimebundle_()["text/html"]
        + "</body></html>"
    )
    dom, console = _browse(page.as_uri() + "#search=40", tmp_path, "--dump-dom")
    assert console == []
    assert dom.count('<details class="rlm-all">') == 2
    assert dom.count('<span class="rlm-count">1 of 2 iterations match</span>') == 2
