#!/usr/bin/env bash
# Installs what txkernel needs on a fresh Debian 12 machine, and nothing that is
# already there: Debian packages with apt-get, then the PyPI test peers into .venv
# (made from /usr/bin/python3 with Debian's site packages visible).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential pkg-config clang libclang-rt-14-dev
libzmq3-dev libsodium-dev libjansson-dev libyaml-dev libopenblas-dev libutf8proc-dev
python3 python3-venv python3-pip python3-numpy python3-pytest python3-torch
python3-jupyter-client python3-ipykernel python3-nbclient python3-nbformat
python3-nbconvert jupyter-nbconvert jupyter-console python3-jupyter-console
jupyter-core fortunes fortunes-min
chromium chromium-driver python3-selenium"

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps: installing Debian packages:$missing"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi

# PyPI peers Debian lacks (or has too old): HF tokenizers, safetensors,
# jupyter_kernel_test, nbclient; JupyterLab 4 and Notebook 7 for the browser
# test (tests/browser/), which Debian 12 only has as 3.x/6.x.
PYPI="tokenizers safetensors jupyter_kernel_test nbclient jupyterlab notebook"
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
need=""
for m in tokenizers safetensors jupyter_kernel_test nbclient jupyterlab notebook; do
  .venv/bin/python -c "import $m" 2>/dev/null || need=1
done
if [ -n "$need" ] || ! .venv/bin/python -c "import nbclient,sys; sys.exit(0 if tuple(map(int,nbclient.__version__.split('.')[:2]))>=(0,10) else 1)" 2>/dev/null; then
  echo "deps: installing PyPI test peers into .venv: $PYPI"
  .venv/bin/python -m pip install -q --disable-pip-version-check $PYPI
fi
touch .venv/.deps-ok
