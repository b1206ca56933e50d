"""`dskbench` with the fake kernels of tests/fake_adapters.py and tests/fake_shard_adapters.py in its
registry, for tests that must run the command line as a process (signals):

    python -m tests.cli_with_fakes run --device cpu --kernel fake_ok ...
"""

from __future__ import annotations

import sys

import tests.fake_adapters  # noqa: F401 - registers the fakes
import tests.fake_shard_adapters  # noqa: F401
from dskbench.frontends import cli
from dskbench.frontends.cli import common
from dskbench.shapes.cases import default_shapes
from tests.fake_adapters import registry_entry as _entry

FAKES = ("fake_ok", "fake_wrong", "fake_crash", "fake_poison", "fake_abort", "fake_hang")


def main(argv: list[str]) -> int:
    common.registry_and_shapes = lambda: ({k: _entry(k) for k in FAKES}, default_shapes())
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
