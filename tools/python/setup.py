"""Packs the built C libraries into the wheel: pip install ./tools/python from a checkout whose
build/ holds libzoffload.so (or ZOFFLOAD_BUILD_DIR names the build folder) installs the
package with libzoffload.so and libzoffload_dsconfig.so in zoffload/lib/, the first place
the package looks (zoffload/_native.py). Without a build the package installs alone and finds
the library in an installed prefix or where ZOFFLOAD_LIBRARY points."""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithLibraries(build_py):
    def run(self):
        super().run()
        build = os.environ.get("ZOFFLOAD_BUILD_DIR") or os.path.join(HERE, "..", "..", "build")
        libs = [p for name in ("libzoffload.so", "libzoffload_dsconfig.so")
                for p in glob.glob(os.path.join(build, name))]
        if not libs:
            print(f"zoffload: no built library in {build}: installing the package alone")
            return
        dest = os.path.join(self.build_lib, "zoffload", "lib")
        os.makedirs(dest, exist_ok=True)
        for p in libs:
            shutil.copy2(p, dest, follow_symlinks=True)


setup(cmdclass={"build_py": BuildWithLibraries})
