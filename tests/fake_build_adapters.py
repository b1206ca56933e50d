"""A fake kernel whose first launch in a process "builds" (sleeps, then writes a cache file), as a JIT
build does, for the tests of a run that builds ahead. Its log says which process built and which found
the cache. Loaded in worker subprocesses through DSKBENCH_EXTRA_ADAPTERS=tests.fake_build_adapters;
each line names the process and its niceness; the cache folder and log come from DSKBENCH_TEST_BUILD_DIR.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dskbench.adapters import register
from tests.fake_adapters import _fake, _FakeNorm, _rms

DIR_ENV = "DSKBENCH_TEST_BUILD_DIR"
BUILD_S = 1.0


def _build_once() -> None:
    folder = Path(os.environ[DIR_ENV])
    cache = folder / "module.so"
    with (folder / "log").open("a") as log:
        if cache.exists():
            log.write(f"cached {os.getpid()} {os.nice(0)}\n")
            return
        time.sleep(BUILD_S)
        cache.write_text("built")
        log.write(f"built {os.getpid()} {os.nice(0)}\n")


_built = False


def _bind_slow_build(fn, inputs, case):
    def launch():
        global _built
        if not _built:  # a process loads the module once
            _build_once()
            _built = True
        return _rms(inputs["x"], inputs["w"])

    return launch


@register
class FakeSlowBuild(_FakeNorm):
    kernel = "fake_slow_build"
    backends = [_fake("fake", _bind_slow_build)]
