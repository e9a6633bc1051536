"""engine: pytorch, `torch_version: 1.13`, against torch 1.13 itself (issue 26).

The torch 1.13 row (.venv: Debian's torch 1.13 + transformers 4.40) has no
kineto, and its legacy profiler reports memory per op without addresses, so
the grid's reference (test_torchplan_grid.py) cannot replay its allocator.
Here the same allocator events come from tests/torchplan/alloc_events.c,
LD_PRELOAD'ed into that Python: c10's CPU allocator takes every storage from
posix_memalign() and returns it with free(), and the library records both.

1. The library is checked against the profiler where both work (torch 2.x,
   one row): the peaks agree within 0.5 % (the library also sees the few
   small buffers kernels take in their worker threads, which the profiler,
   tracing the main thread, does not).
2. Every row of the grid, with eager attention (transformers 4.40 runs
   BERT's attention eagerly only), runs two training steps on torch 1.13 with
   the version's own zero_grad() (it fills the gradients with zeros and keeps
   them), and `txk plan` of the same config with `torch_version: 1.13` must
   give a steady-step and a first-step peak within 3 % of torch's and never
   under it by more than 1 %, as on the torch 2.x row. A bf16 row's figure
   is torch's with its oneDNN GEMMs off, as on the torch 2.x row (the
   default run's is printed beside it: oneDNN's scratchpad comes through
   c10's allocator on a CPU with AVX-512 and its size is that CPU's).
"""
import os, time

import pytest

import test_torchplan_grid as grid

T1 = os.path.join(grid.ROOT, ".venv", "bin", "python")
ROWS = {name: dict(r, attn="eager") for name, r in grid.ROWS.items()}


def test_library_agrees_with_the_profiler():
    row = ROWS["tiny-16x128-eager"]
    prof, = grid.reference(grid.T2, [row])
    lib, = grid.reference(grid.T2, [row], shim=True)
    for key in ("peak_allocated", "first_step_peak_allocated"):
        ratio = lib[key] / prof[key]
        print(f"torch {lib['torch']}: {key} alloc_events {lib[key]} profiler {prof[key]} ratio {ratio:.4f}")
        assert abs(ratio - 1) <= 0.005, (key, lib[key], prof[key])


@pytest.fixture(scope="module")
def torch1_figures():
    assert os.access(T1, os.X_OK), f"{T1} is missing (scripts/deps.sh installs the torch 1.13 row)"
    t0 = time.time()
    out = grid.reference(T1, list(ROWS.values()), shim=True)
    print(f"\nreference: {len(ROWS)} rows in {time.time() - t0:.1f} s on torch {out[0]['torch']} + "
          f"transformers {out[0]['transformers']} (alloc_events.c)")
    assert out[0]["torch"].startswith("1.13"), out[0]
    return dict(zip(ROWS, out))


@pytest.mark.parametrize("name", list(ROWS))
def test_torch1_row(name, torch1_figures, tmp_path):
    got = grid.plan(tmp_path, ROWS[name], "torch_version: 1.13\n")
    assert got["engine"] == "pytorch" and got["device"] == "cpu" and got["torch_version"] == "1.13"
    grid.check_peaks(name, got, torch1_figures[name])
