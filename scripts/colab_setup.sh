#!/usr/bin/env bash
# colab_setup.sh — txkernel on a Colab runtime (Ubuntu) in one cell:
#
#   !git clone URL txkernel && bash txkernel/scripts/colab_setup.sh
#
# As root (Colab runs notebooks as root) it installs the Ubuntu packages the
# engine needs that are missing, builds the cuda plugin for this runtime's GPU
# (compute capability from nvidia-smi, the runtime's own nvcc), builds
# txkernel, txk and the companion's engine, installs the binaries and the
# kernelspec under /usr/local, installs the companion into the runtime's
# Python (`pip install .`), and prints the two ways to use it.
#
#   --prefix DIR   installs nothing system-wide: no apt-get, binaries and
#                  kernelspec under DIR, the companion into a new venv DIR/venv
#                  (with the system's site packages, for ipykernel). Needs no
#                  root, but the packages must already be there. `make test`
#                  runs this mode (tests/suites/colab_setup.sh).
#   --python PY    the Python to install the companion into (default python3)
#   --no-cuda      do not build the cuda plugin even where nvcc and a GPU exist
#   --wheel W      builds nothing and needs no apt: pip-installs the release
#                  wheel W (a file, e.g. from `make wheel`, or the URL of
#                  the .whl on the repository's release page) into PY and
#                  installs its kernelspec (txkernel-kernelspec; under
#                  --prefix DIR into DIR). The wheel carries the engine, the
#                  cuda plugin for sm_75..sm_120, txk and txkernel.
#
# Refuses, saying why and what to do, when a package is missing in --prefix
# mode or when it is not root without --prefix. Exit status 0 on success, 2 on
# a refusal or a usage error, else the failing step's status.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

# Ubuntu (22.04, Colab's) and Debian 12 share these names.
PKGS="build-essential pkg-config libzmq3-dev libsodium-dev libcurl4-openssl-dev libjansson-dev libyaml-dev
libopenblas-dev libutf8proc-dev python3-venv python3-pip"

prefix=""
python=python3
cuda=auto
wheel=""
refuse() { echo "colab_setup: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || refuse "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --python) [ $# -ge 2 ] || refuse "--python needs an interpreter"; python=$2; shift 2 ;;
    --no-cuda) cuda=no; shift ;;
    --wheel) [ $# -ge 2 ] || refuse "--wheel needs a .whl file or URL"; wheel=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) refuse "unknown argument '$1' (--prefix DIR, --python PY, --no-cuda, --wheel W, --help)" ;;
  esac
done

if [ -n "$wheel" ]; then
  # the release wheel: no packages, no compiler, seconds
  py=$python
  if [ -n "$prefix" ]; then
    mkdir -p "$prefix"
    prefix=$(cd "$prefix" && pwd)
    "$python" -m venv --system-site-packages "$prefix/venv"
    py="$prefix/venv/bin/python"
  fi
  "$py" -m pip install -q --disable-pip-version-check "$wheel"
  if [ -n "$prefix" ]; then
    "$py" -m txkernel.kernelspec --prefix "$prefix"
  else
    "$py" -m txkernel.kernelspec --sys-prefix
  fi
  echo
  echo "txkernel is installed from the wheel ($("$py" -c 'import txkernel; print(txkernel.version())'))."
  echo "In this notebook, on its own Python kernel: %load_ext txkernel, then %%txtrain, %txplan,"
  echo "%txadvise, %txfix ... in any cell (%txhelp lists them). txk is on the path of $py's scripts."
  exit 0
fi

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done

if [ -z "$prefix" ]; then
  [ "$(id -u)" = 0 ] || refuse "needs root: it installs Ubuntu packages with apt-get and writes /usr/local.
  Run it as root (Colab notebooks run as root: !bash scripts/colab_setup.sh), or with
  --prefix DIR to install nothing system-wide."
  if [ -n "$missing" ]; then
    echo "colab_setup: installing Ubuntu packages:$missing"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
  fi
else
  [ -z "$missing" ] || refuse "--prefix installs nothing system-wide, so these packages must be there already:$missing
  (as root: apt-get install$missing)"
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
fi

# The runtime's GPU: build the plugin for its compute capability only, with
# the runtime's nvcc (one architecture keeps the build to a minute or two).
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
nvcc=$(command -v nvcc 2>/dev/null || true)
[ -n "$nvcc" ] || { [ -x "$CUDA_HOME/bin/nvcc" ] && nvcc=$CUDA_HOME/bin/nvcc; } || true
gpu=""
if [ "$cuda" = auto ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n 1 || true)
fi
built_cuda=no
if [ -n "$gpu" ] && [ -n "$nvcc" ]; then
  cap=$(echo "$gpu" | awk -F', *' '{print $NF}')
  sm=$(echo "$cap" | tr -d '.')
  case "$sm" in
    ''|*[!0-9]*) echo "colab_setup: cannot read the compute capability from nvidia-smi ('$gpu'); building for sm_75, sm_80, sm_90"
                 gencode="" ;;
    *) gencode="-gencode arch=compute_$sm,code=[sm_$sm,compute_$sm]" ;;
  esac
  echo "colab_setup: GPU ${gpu%%,*} (compute capability $cap): building the cuda plugin with $nvcc"
  if [ -n "$gencode" ]; then
    make -j2 build/libtk_cuda.so NVCC="$nvcc" CUDA_HOME="$CUDA_HOME" CUDA_GENCODE="$gencode"
  else
    make -j2 build/libtk_cuda.so NVCC="$nvcc" CUDA_HOME="$CUDA_HOME"
  fi
  built_cuda=yes
elif [ "$cuda" = no ]; then
  echo "colab_setup: --no-cuda: cpu and meta devices only"
else
  echo "colab_setup: no GPU or no nvcc on this runtime: cpu and meta devices only (plans still simulate any GPU profile)"
fi

make -j2 build/txkernel build/txk build/libtxk.so

dest=${prefix:-/usr/local}
make --no-print-directory install PREFIX="$dest"
if [ "$built_cuda" = yes ]; then
  # next to the executable, where the engine looks first (gpu/dev.c)
  install -d "$dest/lib/txkernel"
  install -m 755 build/libtk_cuda.so "$dest/lib/txkernel/"
fi

if [ -n "$prefix" ]; then
  "$python" -m venv --system-site-packages "$prefix/venv"
  py="$prefix/venv/bin/python"
else
  py=$python
fi
if ! "$py" -c "import setuptools, wheel" 2>/dev/null; then
  [ -z "$prefix" ] || refuse "$py has no setuptools or no wheel, which building the companion needs
  (Debian/Ubuntu: apt-get install python3-setuptools python3-wheel, and --python /usr/bin/python3)"
  "$py" -m pip install -q --disable-pip-version-check setuptools wheel
fi
# --no-build-isolation: setuptools is already there (Colab, Debian), so no
# index is needed; setup.py copies build/libtk_cuda.so into the package too
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$ROOT"

echo
echo "txkernel is installed ($("$py" -c 'import txkernel; print(txkernel.version())'); kernel: $dest/bin/txkernel)."
echo "Two ways to use it:"
echo "  1. In this notebook, on its own Python kernel:"
echo "       %load_ext txkernel"
echo "     then %%txtrain, %txplan, %txadvise, %txfix ... in any cell (%txhelp lists them)."
echo "  2. The txkernel kernel itself: its kernelspec is now on this runtime"
echo "     ($dest/share/jupyter/kernels/txkernel). In JupyterLab, Notebook or VS Code,"
echo "     pick \"txkernel (BERT OOM doctor)\". Colab runs every notebook on its own"
echo "     IPython kernel (googlecolab/colabtools#3988): switching a Colab notebook to"
echo "     this kernelspec has not been seen to work, so in Colab use way 1."
if [ -n "$prefix" ]; then
  echo "  (--prefix: use $py for way 1, and JUPYTER_PATH=$dest/share/jupyter for way 2)"
fi
