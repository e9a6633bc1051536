#!/usr/bin/env bash
# Runs the OOM-message fuzz target (advisor/module.mk) for 30 s from the real
# messages in tests/data/oom_messages. Last line: "1 passed, 0 failed" when no
# crash, hang or sanitizer report, else "0 passed, 1 failed".
cd "$(dirname "$0")/../.."
BIN=${OOMMSG_FUZZ_BIN:-build/fuzz/fuzz_oom_message}
SECS=${FUZZ_SECONDS:-30}
if [ ! -x "$BIN" ]; then
  echo "fuzz target $BIN is missing (built by 'make all' through advisor/module.mk)"
  echo "0 passed, 1 failed"; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp tests/data/oom_messages/*.txt "$work/corpus"/
"$BIN" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
       -artifact_prefix="$work/" "$work/corpus" > "$work/log" 2>&1
rc=$?
grep -E "^(#[0-9]+|INFO|Done|==|SUMMARY|ERROR)" "$work/log" | grep -v "^#[0-9]*	\(NEW\|REDUCE\|pulse\)" | tail -8
if [ $rc -eq 0 ] && ! grep -qE "ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:" "$work/log"; then
  echo "1 passed, 0 failed"
else
  grep -A30 -E "ERROR:|runtime error:" "$work/log" | head -60
  echo "0 passed, 1 failed"; exit 1
fi
