"""Peak memory of handing a large DataFrame to an RLM run: live contexts are bound by
reference, so the run's peak RSS should grow by the session's own overhead, not by the frame.

    python python/benches/live_context_rss.py [--gb 1.0]

Prints the frame's size, the process's peak RSS before and after a run over it (against the
mock LM server on 127.0.0.1), and, as the baseline measured in the same process, the peak
after serialising the frame once (what a copy-based hand-over would add at least).
"""

import argparse
import io
import resource

import polars as pl

from rlm_kernel import RLM, MockServer


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0, help="frame size in GB")
    args = parser.parse_args()
    rows = int(args.gb * 1e9 / 16)
    frame = pl.DataFrame({"a": pl.int_range(0, rows, eager=True), "b": pl.int_range(0, rows, eager=True)})
    size_mb = frame.estimated_size() / 1e6
    before = peak_mb()
    script = {"models": {"root": {"replies": [
        "```repl\nprint(context.height, int(context['a'].max()))\n```",
        "```repl\nFINAL_VAR(str(context.height))\n```",
    ]}}}
    with MockServer(script) as mock:
        result = RLM(model="root", base_url=mock.base_url).completion("How many rows?", context=frame)
    assert result.answer == str(rows), result.answer
    after_run = peak_mb()
    buffer = io.BytesIO()
    frame.write_ipc(buffer)
    after_copy = peak_mb()
    del buffer
    print(f"frame                      {size_mb:10.0f} MB ({rows:,} rows)")
    print(f"peak RSS before the run    {before:10.0f} MB")
    print(f"peak RSS after the run     {after_run:10.0f} MB  (+{after_run - before:.0f} MB, "
          f"{(after_run - before) / size_mb:.3f}x the frame)")
    print(f"baseline: after one copy   {after_copy:10.0f} MB  (+{after_copy - after_run:.0f} MB, "
          f"{(after_copy - after_run) / size_mb:.3f}x the frame)")


if __name__ == "__main__":
    main()
