"""Installs the txkernel Jupyter kernelspec for the binary this wheel carries
(the wheel's counterpart of `make kernelspec-install`, kernelspec/module.mk):

    txkernel-kernelspec [--user | --sys-prefix | --prefix DIR]

Default --sys-prefix: <sys.prefix>/share/jupyter/kernels/txkernel, which
Jupyter run from this Python finds. The spec starts txkernel/bin/txkernel by
its absolute path, with the cuda plugin and the NVIDIA pip wheels' CUDA
library folders found now in its environment."""
import argparse
import json
import os
import shutil
import sys

from ._cli import HERE, binary
from ._cudalibs import nvidia_lib_dirs

NAME = "txkernel"


def user_dir():
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "jupyter")


def spec(exe):
    env = {"OMP_WAIT_POLICY": "passive", "TXK_CUDA_PLUGIN": os.path.join(HERE, "libtk_cuda.so")}
    dirs = nvidia_lib_dirs()
    if dirs:
        env["TXK_CUDA_LIBDIRS"] = os.pathsep.join(dirs)
    # the same fields as kernelspec/kernel.json.in
    return {"argv": [exe, "-f", "{connection_file}"], "display_name": "txkernel (BERT OOM doctor)",
            "language": "txkernel", "interrupt_mode": "signal", "env": env, "metadata": {"debugger": False}}


def install(data_dir):
    exe = binary("txkernel")
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"txkernel-kernelspec: {exe} is missing: this install was built without the binaries "
                         "(`pip install .`); install the wheel or run `make install` in the repository")
    dest = os.path.join(data_dir, "kernels", NAME)
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "kernel.json"), "w") as f:
        json.dump(spec(exe), f, indent=1)
    for logo in ("logo-32x32.png", "logo-64x64.png"):
        src = os.path.join(HERE, "kernelspec", logo)
        if os.path.exists(src):
            shutil.copy(src, dest)
    return dest


def main(argv=None):
    ap = argparse.ArgumentParser(prog="txkernel-kernelspec", description="Install the txkernel Jupyter kernelspec")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--user", action="store_true", help="into the user's Jupyter data folder")
    g.add_argument("--sys-prefix", action="store_true", help="into sys.prefix/share/jupyter (the default)")
    g.add_argument("--prefix", help="into PREFIX/share/jupyter")
    a = ap.parse_args(argv)
    if a.user:
        data = user_dir()
    elif a.prefix:
        data = os.path.join(a.prefix, "share", "jupyter")
    else:
        data = os.path.join(sys.prefix, "share", "jupyter")
    print(f"txkernel-kernelspec: installed {install(data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
