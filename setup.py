"""The packages, found rather than listed by hand. pyproject.toml maps the repository root to the package
`duplexcadence` (`package-dir`); setuptools' discovery in pyproject.toml cannot prefix what it finds, so here every
folder with an `__init__.py` below the root (tests and scripts aside) ships as `duplexcadence.<folder>`, and this
file, which lies in the root package's folder, is left out of the wheel."""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [module for module in modules if module[:2] != ("duplexcadence", "setup")]


setup(
    packages=["duplexcadence", *(f"duplexcadence.{name}" for name in find_packages(exclude=["tests*", "scripts*"]))],
    cmdclass={"build_py": BuildPy},
)
