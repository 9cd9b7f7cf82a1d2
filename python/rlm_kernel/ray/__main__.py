"""`python -m rlm_kernel.ray eval`: runs the evaluation job on standard input (JSON, see
`_eval`) on a Ray cluster and writes one result a line to standard output; what Ray and the
runs print goes to standard error. Exit 0 when every run has a result line, 1 with an error
on standard error otherwise (2: wrong usage). `rlm eval --ray` is its user."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list) -> int:
    if argv != ["eval"]:
        print(
            "usage: python -m rlm_kernel.ray eval < JOB.json   (the job `rlm eval --ray` sends)",
            file=sys.stderr,
        )
        return 2
    # Results alone on standard output: Ray and the runs' prints go to standard error.
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from ._eval import dumps, run_job

    try:
        job = json.load(sys.stdin)
        for result in run_job(job):
            results.write(dumps(result) + "\n")
            results.flush()
    except Exception as error:  # noqa: BLE001 - said on stderr, exit 1
        print(f"rlm_kernel.ray: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
