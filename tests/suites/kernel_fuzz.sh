#!/usr/bin/env bash
# The message-decoder fuzz target (kernel/module.mk) for 30 s from the seed
# corpus in tests/kernel/fuzz_corpus (tests/fuzz_run.sh says what passes).
cd "$(dirname "$0")/../.."
exec bash tests/fuzz_run.sh "${FUZZ_BIN:-build/fuzz/fuzz_msg}" "${FUZZ_SECONDS:-20}" 4096 tests/kernel/fuzz_corpus/*
