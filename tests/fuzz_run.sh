#!/usr/bin/env bash
# Runs one libFuzzer target for a while from a seed corpus; the suites in
# tests/suites/*_fuzz.sh call it with their own target. Last line: "1 passed,
# 0 failed" when no crash, hang, leak or sanitizer report, else "0 passed,
# 1 failed".
#   tests/fuzz_run.sh BIN SECONDS MAX_LEN CORPUS_FILE...
cd "$(dirname "$0")/.."
BIN=$1 SECS=$2 MAXLEN=$3
shift 3
if [ ! -x "$BIN" ]; then
  echo "fuzz target $BIN is missing (built by 'make all')"
  echo "0 passed, 1 failed"; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$@" "$work/corpus"/
"$BIN" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len="$MAXLEN" \
       -artifact_prefix="$work/" "$work/corpus" > "$work/log" 2>&1
rc=$?
# the targets may log every input they reject on stderr: keep only libFuzzer's lines
grep -E "^(#[0-9]+|INFO|Done|==|SUMMARY|ERROR)" "$work/log" | grep -v "^#[0-9]*	\(NEW\|REDUCE\|pulse\)" | tail -8
if [ $rc -eq 0 ] && ! grep -qE "ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:" "$work/log"; then
  echo "1 passed, 0 failed"
else
  grep -A30 -E "ERROR:|runtime error:" "$work/log" | head -60
  echo "0 passed, 1 failed"; exit 1
fi
