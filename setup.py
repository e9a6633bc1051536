"""The companion's build step: setuptools, because it is the one backend that
both Debian's Python and Colab's already have (so `pip install
--no-build-isolation .` works offline), and a custom build_py is all it takes
to run make. The engine is built by the project's own Makefile (same flags,
same sources as txkernel, -fPIC) rather than described again as a setuptools
Extension, so there is one build description. The wheel is marked
platform-specific because it carries a shared library."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithEngine(build_py):
    def run(self):
        jobs = os.environ.get("TXK_MAKE_JOBS", "2")
        targets = ["build/libtxk.so"]
        if os.environ.get("TXK_BUILD_CUDA") == "1":
            targets.append("build/libtk_cuda.so")
        subprocess.check_call(["make", "-j" + jobs] + targets, cwd=ROOT)
        super().run()
        dest = os.path.join(self.build_lib, "txkernel")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, "build", "libtxk.so"), dest)
        plugin = os.path.join(ROOT, "build", "libtk_cuda.so")
        if os.path.exists(plugin):
            shutil.copy2(plugin, dest)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithEngine}, distclass=BinaryDistribution)
