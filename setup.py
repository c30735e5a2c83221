"""Package layout for setuptools: `qkvqa` from src/ and the top-level `data_modules` package."""
from setuptools import find_packages, setup

packages = find_packages("src") + find_packages(".", include=["data_modules", "data_modules.*"])
package_dir = {"qkvqa": "src/qkvqa", "data_modules": "data_modules"}
setup(packages=packages, package_dir=package_dir)
