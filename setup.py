"""The one build setting pyproject.toml cannot state: the top-level sweeps/ folder (one spec per task
or study, where the checkout and its docs keep them) ships inside the package as `dspark_bench.sweeps`,
so that an installed dspark-bench finds each task's own spec (tuning/spec_files.py's SPEC_FOLDERS) with no
second copy in git. pyproject's package discovery cannot map a folder outside the package into it;
setuptools' package_dir can, given the package list here. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["dspark_bench*"]), "dspark_bench.sweeps"],
      package_dir={"dspark_bench.sweeps": "sweeps"})
