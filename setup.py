"""Package layout for setuptools: `qkvqa` from src/, and the top-level data_modules/ as `qkvqa.data_modules`."""
from setuptools import find_packages, setup

# data_modules/ stays at the top of the repository but is importable only as qkvqa.data_modules, so that it
# cannot collide with another distribution's `data_modules`.
packages = find_packages("src") + ["qkvqa.data_modules"] + [
    f"qkvqa.data_modules.{name}" for name in find_packages("data_modules")]
package_dir = {"qkvqa": "src/qkvqa", "qkvqa.data_modules": "data_modules"}
setup(packages=packages, package_dir=package_dir)
