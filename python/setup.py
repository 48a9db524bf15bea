"""Builds libmoh.so with the project's CMake (the checkout this folder is in) and puts it into the
package: `pip install ./python` from the checkout's root (MOH_CMAKE_ARGS: extra cmake options,
e.g. "-DMOH_CUDA=OFF"; MOH_BUILD_DIR: the build folder, default build/ of the checkout)."""
import os
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        build = os.environ.get("MOH_BUILD_DIR", os.path.join(ROOT, "build"))
        extra = shlex.split(os.environ.get("MOH_CMAKE_ARGS", ""))
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", *extra])
        subprocess.check_call(["cmake", "--build", build, "--target", "moh_shared", "-j", str(os.cpu_count() or 1)])
        dst = os.path.join(self.build_lib, "moh")
        os.makedirs(dst, exist_ok=True)
        shutil.copy2(os.path.join(build, "libmoh.so"), os.path.join(dst, "libmoh.so"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # libmoh.so is native code: a platform wheel
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
