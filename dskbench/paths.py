"""Where dskbench's data lives, so that an installed wheel works as well as a checkout.

- The shapes files and the generated registry live at the top of the checkout (``shapes/``,
  ``kernels_registry/``: ``dskbench registry generate`` writes there by default) and ship inside the
  package as its data (``dskbench/data/shapes/``, ``dskbench/data/registry/`` link to them, and a wheel
  carries their files), so an installed wheel reads the same data.
- The trace documents the registry is generated from are needed only to regenerate: ``traces/`` of the
  checkout the package runs from. An installed package has none, and runs its registry as shipped.
- Results go to the checkout's ``results/`` when dskbench runs from a checkout (editable install or
  ``PYTHONPATH``), else to ``results/`` under the working folder.
- ``DSKBENCH_ROOT=DIR`` overrides all of it with one folder laid out like the package's data folder plus
  the two checkout folders: ``DIR/shapes/``, ``DIR/registry/``, ``DIR/traces/``, ``DIR/results/``
  (tests point it at a fake registry and shapes file). ``DSKBENCH_ROOT=dskbench/data`` in a checkout
  reads the shipped data.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT = PACKAGE_DIR.parent  # the repository root when dskbench runs from a checkout
IN_CHECKOUT = (CHECKOUT / "pyproject.toml").is_file()
_OVERRIDE = os.environ.get("DSKBENCH_ROOT")

REPO_ROOT = Path(_OVERRIDE) if _OVERRIDE else CHECKOUT
DATA_DIR = Path(_OVERRIDE) if _OVERRIDE else PACKAGE_DIR / "data"
TRACES_DIR = REPO_ROOT / "traces"
if _OVERRIDE or not IN_CHECKOUT:
    REGISTRY_DIR = DATA_DIR / "registry"
    SHAPES_DIR = DATA_DIR / "shapes"
else:  # the checkout's own folders (the package's data links to them)
    REGISTRY_DIR = CHECKOUT / "kernels_registry"
    SHAPES_DIR = CHECKOUT / "shapes"
SHAPES_FILE = SHAPES_DIR / "deepseek_r1_nvfp4.yaml"
DEPLOYMENT_FILE = SHAPES_DIR / "deployment.yaml"
RESULTS_DIR = REPO_ROOT / "results" if _OVERRIDE or IN_CHECKOUT else Path.cwd() / "results"
