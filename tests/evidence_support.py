"""What the tests of scripts/evidence/ share: loading a script as a module, and checking that the cases a
probe names are cases of the shapes file (a probe would print 'no case' for one that is not)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

EVIDENCE = Path(__file__).resolve().parents[1] / "scripts" / "evidence"


def load_script(name: str) -> types.ModuleType:
    """scripts/evidence/<name>.py, loaded as a module (its path set-up runs)."""
    spec = importlib.util.spec_from_file_location(name, EVIDENCE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_cases_exist(specs: list[tuple]) -> list[str]:
    """Each (kernel, op, phase, point, backend) is a case of the default shapes: their case ids."""
    from dskbench.execution.fidelity import find_case
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    shapes, registry = default_shapes(), load_registry()
    ids = []
    for kernel, op, phase, point, backend in specs:
        case, why = find_case(shapes, registry, kernel, op, phase, point, backend)
        assert case is not None, why
        ids.append(case.id)
    return ids
