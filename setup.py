"""Package layout for setuptools: `qkvqa` from src/, data_modules/ as `qkvqa.data_modules`, experiments/ as package data."""

from setuptools import find_namespace_packages, find_packages, setup

# data_modules/ stays at the top of the repository but is importable only as qkvqa.data_modules, so that it
# cannot collide with another distribution's `data_modules`.
packages = (
    find_packages("src")
    + ["qkvqa.data_modules"]
    + [f"qkvqa.data_modules.{name}" for name in find_packages("data_modules")]
)
package_dir = {"qkvqa": "src/qkvqa", "qkvqa.data_modules": "data_modules"}
# The YAML configs of experiments/ travel inside an installed wheel as qkvqa/experiments/ (data folders, listed as
# namespace packages so that setuptools copies them), where qkvqa.config.load finds them without a checkout.
experiments = ["qkvqa.experiments"] + [f"qkvqa.experiments.{name}" for name in find_namespace_packages("experiments")]
packages += experiments
package_dir["qkvqa.experiments"] = "experiments"
package_data = {name: ["*.yaml", "*.md"] for name in experiments}
package_data["qkvqa.inspect"] = ["static/*.html", "static/*.js", "static/*.css"]  # the page `qkvqa inspect` writes
setup(packages=packages, package_dir=package_dir, package_data=package_data)
