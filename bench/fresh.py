"""A bench binary must be built from the library it times: `make all` does
not rebuild BUILD/bench/*, and a run of an old binary measures old code (it
happened: bench/RESULTS.md, "speed", the correction of 2026-11-26)."""
import os
import sys


def require_fresh(build, name):
    """BUILD/bench/NAME, or exit naming the make target when it is missing or
    older than BUILD/libtk.a."""
    exe = os.path.join(build, "bench", name)
    lib = os.path.join(build, "libtk.a")
    if not os.path.exists(exe):
        sys.exit(f"{exe} is missing: make {exe}")
    if os.path.exists(lib) and os.path.getmtime(lib) > os.path.getmtime(exe):
        sys.exit(f"{exe} is older than {lib}, so it would time old code: make {exe}")
    return exe
