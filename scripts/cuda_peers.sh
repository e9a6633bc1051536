#!/usr/bin/env bash
# cuda_peers.sh — the other CUDA major's libraries for the plugin's loading
# test (tests/wheel/test_cuda_libs.py). .venv-t2's torch brings CUDA 13's
# (nvidia/cu13/lib); this puts CUDA 12's cuBLAS, cuBLASLt and CUPTI, as
# Colab's torch has them (the 12.8 series), in .cuda-peers/cu12/ in the
# pip wheels' own layout (nvidia/cublas/{lib,include},
# nvidia/cuda_cupti/{lib,include}). Only those files are unpacked (about
# 840 MB, most of it libcublasLt.so.12); the downloaded wheels (605 MB) are
# deleted. Does nothing when they are there. Last line: the folder.
# scripts/deps.sh (the test tier) runs it: the tests themselves never reach
# the network, they only read the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.cuda-peers/cu12
DL=.cuda-peers/dl
PKGS="nvidia-cublas-cu12==12.8.5.5 nvidia-cuda-cupti-cu12==12.8.90"
if [ -f $DEST/.complete ]; then echo "cuda_peers: $DEST"; exit 0; fi
rm -rf $DL $DEST
mkdir -p $DL $DEST
echo "cuda_peers: downloading $PKGS"
/usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d $DL $PKGS
/usr/bin/python3 - "$DEST" $DL/*.whl <<'PY'
import sys, zipfile
dest, wheels = sys.argv[1], sys.argv[2:]
keep = ("nvidia/cublas/lib/libcublas.so.12", "nvidia/cublas/lib/libcublasLt.so.12",
        "nvidia/cuda_cupti/lib/libcupti.so.12")
for w in wheels:
    z = zipfile.ZipFile(w)
    for n in z.namelist():
        if n in keep or "/include/" in n:
            z.extract(n, dest)
PY
rm -rf $DL
touch $DEST/.complete
echo "cuda_peers: $DEST"
