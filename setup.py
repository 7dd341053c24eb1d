"""Package discovery for tgsim (pyproject.toml holds everything else).

setuptools' `[tool.setuptools.packages.find]` cannot rename folders, and three folders of this
repository install under the `tgsim` namespace: `analysis/` as `tgsim.analysis`, `mpi_runs/` as
`tgsim.mpi_runs` and `papers_figures/` as `tgsim.papers_figures`. This file finds every package
under `tgsim/` (data-only folders such as `tgsim/cuda` and `tgsim/configs` included, as namespace
packages) and every package under each renamed folder, so a new subpackage ships without an edit
here. tests/test_wheel.py builds the wheel and the sdist and checks that every tracked source and
data file is inside.
"""

from setuptools import find_namespace_packages, find_packages, setup

RENAMED = {"tgsim.analysis": "analysis", "tgsim.mpi_runs": "mpi_runs", "tgsim.papers_figures": "papers_figures"}

packages = find_namespace_packages(include=["tgsim", "tgsim.*"])
package_dir = dict(RENAMED)
for name, folder in RENAMED.items():
    # regular packages only below a renamed folder: generated folders (papers_figures/out) stay out
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
