#!/usr/bin/env bash
# The pasted-OOM-message reader's fuzz target (advisor/module.mk) for 20 s
# from the real messages in tests/data/oom_messages.
cd "$(dirname "$0")/../.."
exec bash tests/fuzz_run.sh "${OOMMSG_FUZZ_BIN:-build/fuzz/fuzz_oom_message}" "${FUZZ_SECONDS:-10}" 8192 tests/data/oom_messages/*.txt
