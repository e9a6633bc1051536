"""The companion's build step: setuptools, because it is the one backend that
both Debian's Python and Colab's already have (so `pip install
--no-build-isolation .` works offline), and a custom build_py is all it takes
to run make. The engine is built by the project's own Makefile (same flags,
same sources as txkernel, -fPIC) rather than described again as a setuptools
Extension, so there is one build description. The wheel is marked
platform-specific because it carries a shared library, and tagged py3-none
because nothing in it is tied to one Python (the engine is loaded through
ctypes).

TXK_WHEEL=1 (scripts/wheel.sh, `make wheel`) builds the release wheel: it
also carries the cuda plugin, the txk and txkernel binaries (txkernel/bin/,
run by the `txk` and `txkernel` commands) and the kernelspec's logos, each
without its debug sections; auditwheel then puts the libraries they need in
the wheel. It stages in build/wheel-stage/, so a later `pip install .` does
not pick its files up."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
WHEEL = os.environ.get("TXK_WHEEL") == "1"


def _copy(src, dest_dir, strip=False):
    dest = os.path.join(dest_dir, os.path.basename(src))
    shutil.copy2(src, dest)
    if strip:
        subprocess.check_call(["strip", "--strip-debug", dest])


class BuildWithEngine(build_py):
    def run(self):
        jobs = os.environ.get("TXK_MAKE_JOBS", "2")
        targets = ["build/libtxk.so"]
        if WHEEL:
            targets += ["build/libtk_cuda.so", "build/txk", "build/txkernel"]
        elif os.environ.get("TXK_BUILD_CUDA") == "1":
            targets.append("build/libtk_cuda.so")
        subprocess.check_call(["make", "-j" + jobs] + targets, cwd=ROOT)
        super().run()
        dest = os.path.join(self.build_lib, "txkernel")
        os.makedirs(dest, exist_ok=True)
        _copy(os.path.join(ROOT, "build", "libtxk.so"), dest, strip=WHEEL)
        plugin = os.path.join(ROOT, "build", "libtk_cuda.so")
        if WHEEL and not os.path.exists(plugin):
            raise SystemExit("TXK_WHEEL=1: build/libtk_cuda.so was not built (no nvcc?): the wheel must carry "
                             "the cuda plugin")
        if os.path.exists(plugin):
            _copy(plugin, dest, strip=WHEEL)
        if WHEEL:
            os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
            for b in ("txk", "txkernel"):
                _copy(os.path.join(ROOT, "build", b), os.path.join(dest, "bin"), strip=True)
            os.makedirs(os.path.join(dest, "kernelspec"), exist_ok=True)
            for logo in ("logo-32x32.png", "logo-64x64.png"):
                _copy(os.path.join(ROOT, "kernelspec", logo), os.path.join(dest, "kernelspec"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithEngine}
try:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class PyNoneWheel(bdist_wheel):
        def get_tag(self):
            return ("py3", "none") + tuple(super().get_tag()[2:])

    cmdclass["bdist_wheel"] = PyNoneWheel
except ImportError:
    pass

options = {"build": {"build_base": os.path.join("build", "wheel-stage")}} if WHEEL else {}
setup(cmdclass=cmdclass, distclass=BinaryDistribution, options=options)
