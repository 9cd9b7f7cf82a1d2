"""The first process of a PID namespace started by the tests (`test_ray.py`): runs the
command it is given and reaps every process the kernel hands it, then exits with the
command's status.

A PID namespace's first process inherits every orphan in it, and must reap them as `init`
does: a process whose parent ended is re-parented to it. The Ray suite's hosts (Ray's actors,
`rlm eval`'s driver) each keep a worker template (`kernel/cli/docs/security.md`, "Workers
forked from a template"); when a host ends, its template dies by its death signal and is
handed to this process. pytest as the first process never reaps them: they stayed zombies
(`[rlm-template] <defunct>`) until the suite ended.
"""

import os
import sys


def main(argv: list) -> int:
    if not argv:
        print("usage: namespace_init.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    command = os.posix_spawnp(argv[0], argv, os.environ)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            # The command was reaped already (cannot happen: only this loop waits).
            return 1
        if pid == command:
            code = os.waitstatus_to_exitcode(status)
            # A signal's number as a shell says it (128 + N).
            return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
