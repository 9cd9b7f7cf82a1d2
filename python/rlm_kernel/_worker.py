"""The worker process of an isolated session (`isolation="process"`, the default): the same
kernel-library worker as `rlm __worker`, run by the host's own Python so that the model's
code imports the same packages. The package starts it (`python -m rlm_kernel._worker`, with
its link to the host on fd 3); it is not meant to be run by hand."""

import os

from . import _native

if __name__ == "__main__":
    # Never back into this interpreter's shutdown: a thread of the model's code may still run.
    os._exit(_native.worker_main())
