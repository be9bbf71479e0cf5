"""Packaging beyond what pyproject.toml can say: the top-level ``conf/`` (Hydra configs) and
``data/registry.yaml`` (dataset sources) ship inside the package as ``dpr/conf/`` and
``dpr/_registry/``, so a wheel installed anywhere finds them (`dpr.resources`). In the source tree
and in editable installs they stay where they are documented: ``conf/`` and ``data/`` at the root.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["dpr", "dpr.*"]) + ["dpr.conf", "dpr._registry"],
    package_dir={"dpr.conf": "conf", "dpr._registry": "data"},
    package_data={"dpr.conf": ["*.yaml", "**/*.yaml"], "dpr._registry": ["registry.yaml"]},
    include_package_data=False,  # only the files named above: never data/prepared/ or data/cache/
)
