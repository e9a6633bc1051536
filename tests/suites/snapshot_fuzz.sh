#!/usr/bin/env bash
# The pickle, PyTorch snapshot and pytorch_model.bin readers' fuzz target
# (advisor/module.mk) for 20 s from tests/advisor/fuzz_corpus (small snapshots
# in every form, torch.save state dicts in both formats, a global).
cd "$(dirname "$0")/../.."
exec bash tests/fuzz_run.sh "${SNAP_FUZZ_BIN:-build/fuzz/fuzz_snapshot}" "${FUZZ_SECONDS:-10}" 8192 tests/advisor/fuzz_corpus/*
