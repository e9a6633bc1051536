#!/usr/bin/env bash
# Runs the message-decoder fuzz target (kernel/module.mk) for 60 s from the seed
# corpus in tests/kernel/fuzz_corpus. Last line: "1 passed, 0 failed" when no
# crash, hang or sanitizer report, else "0 passed, 1 failed".
cd "$(dirname "$0")/../.."
BIN=${FUZZ_BIN:-build/fuzz/fuzz_msg}
SECS=${FUZZ_SECONDS:-60}
if [ ! -x "$BIN" ]; then
  echo "fuzz target $BIN is missing (built by 'make all' through kernel/module.mk)"
  echo "0 passed, 1 failed"; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp tests/kernel/fuzz_corpus/* "$work/corpus"/
"$BIN" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
       -artifact_prefix="$work/" "$work/corpus" > "$work/log" 2>&1
rc=$?
# the kernel logs every dropped message on stderr: keep only libFuzzer's lines
grep -E "^(#[0-9]+|INFO|Done|==|SUMMARY|ERROR)" "$work/log" | grep -v "^#[0-9]*	\(NEW\|REDUCE\|pulse\)" | tail -15
if [ $rc -eq 0 ] && ! grep -qE "ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:" "$work/log"; then
  echo "1 passed, 0 failed"
else
  grep -A30 -E "ERROR:|runtime error:" "$work/log" | head -60
  echo "0 passed, 1 failed"; exit 1
fi
