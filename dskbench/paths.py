"""Where the data lives: the repository's folders, overridable for tests and installed use."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(os.environ.get("DSKBENCH_ROOT", Path(__file__).resolve().parent.parent))
TRACES_DIR = REPO_ROOT / "traces"
REGISTRY_DIR = REPO_ROOT / "kernels_registry"
SHAPES_FILE = REPO_ROOT / "shapes" / "deepseek_r1_nvfp4.yaml"
RESULTS_DIR = REPO_ROOT / "results"
