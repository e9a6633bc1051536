#!/usr/bin/env bash
# colab_setup.sh — scripts/colab_setup.sh in the mode that installs nothing
# system-wide (--prefix: binaries, kernelspec and a venv under a temporary
# directory), then the companion check of tests/companion on what it
# installed: demo 01's cells under `%load_ext txkernel` on that venv's python3
# kernel equal the installed txkernel kernel's, and the Colab quickstart's
# cells (bar setup and GPU run) run there. Also: it refuses, saying what
# is missing, without the packages, and without root when asked to install
# system-wide (both simulated by PATH shims; the shims for apt-get and make
# fail loudly, so nothing is installed even if a check were wrong).
# Last line: "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
pass=0
fail=0
check() { # check NAME COMMAND...
    local name=$1; shift
    if "$@"; then pass=$((pass + 1)); echo "ok   $name"
    else fail=$((fail + 1)); echo "FAIL $name"; fi
}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/shim-nopkg" "$T/shim-user"
for d in shim-nopkg shim-user; do
    for tool in apt-get make; do
        printf '#!/bin/sh\necho "%s must not run here" >&2\nexit 99\n' "$tool" > "$T/$d/$tool"
        chmod +x "$T/$d/$tool"
    done
done
printf '#!/bin/sh\nexit 1\n' > "$T/shim-nopkg/dpkg-query"
printf '#!/bin/sh\n[ "$1" = -u ] && { echo 1000; exit 0; }\nexec /usr/bin/id "$@"\n' > "$T/shim-user/id"
chmod +x "$T/shim-nopkg/dpkg-query" "$T/shim-user/id"

refuses() { # refuses SHIMDIR EXPECTED ARGS...
    local shim=$1 want=$2; shift 2
    local err rc
    err=$(PATH="$shim:$PATH" bash scripts/colab_setup.sh "$@" 2>&1 >/dev/null); rc=$?
    echo "$err" | sed 's/^/     /'
    [ "$rc" = 2 ] && echo "$err" | grep -q -- "$want"
}
check "refuses without the packages (--prefix)" refuses "$T/shim-nopkg" "libjansson-dev" --prefix "$T/never"
check "refuses without root (system-wide)" refuses "$T/shim-user" "needs root"
check "nothing written by the refusals" test ! -e "$T/never"

PY=/usr/bin/python3
log=$T/setup.log
check "colab_setup.sh --prefix installs into the prefix" \
    bash -c "bash scripts/colab_setup.sh --prefix '$T/p' --python $PY > '$log' 2>&1 || { tail -20 '$log'; exit 1; }"
check "binaries and kernelspec under the prefix" \
    test -x "$T/p/bin/txkernel" -a -f "$T/p/share/jupyter/kernels/txkernel/kernel.json"
check "the companion lives in the prefix's venv" \
    bash -c "'$T/p/venv/bin/python' -c 'import txkernel; assert txkernel.__file__.startswith(\"$T/p/venv/\")'"
check "prints both ways, the kernelspec one as not seen to work in Colab" bash -c "grep -q '%load_ext txkernel' '$log' && grep -q 'has not been seen to work' '$log'"
check "demo 01 under %load_ext equals the installed txkernel; quickstart runs" \
    env TXK_COMPANION_PYTHON="$T/p/venv/bin/python" TXKERNEL_BIN="$T/p/bin/txkernel" \
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/companion/test_load_ext.py -k "installed or demo or quickstart"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
