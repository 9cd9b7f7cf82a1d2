"""What handing a large DataFrame to an RLM run costs, by isolation.

    python python/benches/live_context_rss.py [--gb 1.0] [--isolation process|none]

With `none` (the session in this interpreter) the frame is bound by reference, so the run's
peak RSS should grow by the session's own overhead, not by the frame. With `process` (the
default) it goes to the worker process once, as an Arrow IPC file in shared memory (a memfd)
that the worker's polars memory-maps: the run costs one write of the frame, in time, and the
memfd's pages (shared, not this process's heap).

Prints the frame's size, this process's peak RSS before and after a run over it (against the
mock LM server on 127.0.0.1), the run's wall time against a run over a one-row frame (the
session's own start-up), and, as the baseline measured in the same process, the peak after
serialising the frame once into this process's memory (what a copy-based hand-over would add
at least) and how long that took.
"""

import argparse
import io
import resource
import time

import polars as pl

from rlm_kernel import RLM, MockServer


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_over(frame, isolation: str) -> float:
    """Seconds for a two-iteration run that reads the whole frame."""
    script = {"models": {"root": {"replies": [
        "```repl\nprint(context.height, int(context['a'].max()))\n```",
        "```repl\nrows = str(context.height)\nFINAL_VAR(rows)\n```",
    ]}}}
    with MockServer(script) as mock:
        started = time.perf_counter()
        result = RLM(model="root", base_url=mock.base_url, isolation=isolation).completion(
            "How many rows?", context=frame
        )
        took = time.perf_counter() - started
    assert result.answer == str(frame.height), (result.answer, result.error)
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0, help="frame size in GB")
    parser.add_argument("--isolation", choices=["process", "none"], default="process")
    args = parser.parse_args()
    rows = int(args.gb * 1e9 / 16)
    frame = pl.DataFrame({"a": pl.int_range(0, rows, eager=True), "b": pl.int_range(0, rows, eager=True)})
    tiny = frame.head(1)
    size_mb = frame.estimated_size() / 1e6
    run_over(tiny, args.isolation)  # warm: the interpreter, the mock, a spare worker
    time.sleep(0.5)
    small = run_over(tiny, args.isolation)
    time.sleep(0.5)
    before = peak_mb()
    whole = run_over(frame, args.isolation)
    after_run = peak_mb()
    started = time.perf_counter()
    buffer = io.BytesIO()
    frame.write_ipc(buffer)
    copy_s = time.perf_counter() - started
    after_copy = peak_mb()
    del buffer
    print(f"isolation                  {args.isolation}")
    print(f"frame                      {size_mb:10.0f} MB ({rows:,} rows)")
    print(f"peak RSS before the run    {before:10.0f} MB")
    print(f"peak RSS after the run     {after_run:10.0f} MB  (+{after_run - before:.0f} MB, "
          f"{(after_run - before) / size_mb:.3f}x the frame)")
    print(f"run over the frame         {whole:10.3f} s   (over one row: {small:.3f} s, "
          f"+{whole - small:.3f} s for the frame)")
    print(f"baseline: after one copy   {after_copy:10.0f} MB  (+{after_copy - after_run:.0f} MB, "
          f"{(after_copy - after_run) / size_mb:.3f}x the frame), written in {copy_s:.3f} s")


if __name__ == "__main__":
    main()
