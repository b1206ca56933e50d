"""asv benchmarks generated from the kernel registry: one class per kernel, one param per (case, backend).

Nothing is written by hand per kernel. At import this module reads the selection from environment
variables (dskbench.frontends.suite.config.ASV_ENV: DSKBENCH_ASV_SWEEP=decode, DSKBENCH_ASV_KERNELS=rmsnorm,...,
DSKBENCH_ASV_QUICK=1, DSKBENCH_DEVICE=cpu, ...) and takes the plan from dskbench.frontends.suite's on-disk cache,
so the process asv starts for every (benchmark, param) imports neither torch nor a kernel library.

Per kernel class:
- ``params`` is one list of ``"<case_id>|<backend>"`` strings: the valid pairs are sparse, and asv
  would expand separate case and backend lists into their full product.
- ``setup_cache`` measures every case of the kernel once, in one process, through the runner
  (isolated worker, JSON lines kept under results/asv-jsonl/) and returns a plain dict.
- ``track_latency`` returns ``{"samples": [seconds...], "number": 1}``: asv treats that as a timing
  result and computes median, CI and quartiles from the core's GPU samples.
- ``track_bandwidth`` is GB/s; asv.conf.json turns regression detection off for it (asv takes a rise
  as a regression).
- A skipped, wrong or failed case raises NotImplementedError in ``setup`` (asv shows n/a); the reason
  is in the kept JSON lines.
"""

from __future__ import annotations

import hashlib
import linecache
from pathlib import Path
from typing import Any

from dskbench.frontends.asv.benchmarks import SUITE_VERSION, asv_jsonl_dir, class_name, setup_cache_timeout
from dskbench.frontends.suite.config import config_from_env, label
from dskbench.frontends.suite.measure import measure_kernel
from dskbench.frontends.suite.plan_cache import load_plan

try:
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # imported outside asv (tests, tooling)

    class SkipNotImplemented(NotImplementedError):
        pass


_CHECKOUT = Path(__file__).resolve().parent.parent
_PLAN = load_plan(config_from_env())
_CONFIG = _PLAN.config  # as planned: the default tp cut to the profile's degrees, as `dskbench run` does


class _KernelBenchmark:
    """Base of the generated classes (its leading underscore keeps asv from collecting it)."""

    kernel = ""
    param_names = ["case"]
    params: list[list[str]] = [[]]
    # Explicit: asv's default version hashes the source, which every generated class shares.
    version = f"dskbench-{SUITE_VERSION}-{_CONFIG.options.mode}"
    timeout = 120.0  # one track_* call only reads the cache

    def _measure(self) -> dict[str, Any]:
        cache = measure_kernel(
            self.kernel,
            _PLAN.items(self.kernel),
            _CONFIG,
            keep_dir=asv_jsonl_dir(_CHECKOUT),
            progress=_progress,
        )
        print(f"dskbench {self.kernel}: {cache['summary']}")
        return cache

    def setup(self, cache: dict[str, Any], case: str) -> None:
        rec = cache["cases"].get(case)
        if rec is None:
            raise NotImplementedError(f"{case}: no result in this run")
        if rec["status"] != "ok":
            raise NotImplementedError(f"{rec['status']}: {rec['reason']}")

    def track_latency(self, cache: dict[str, Any], case: str) -> dict[str, Any]:
        return {"samples": cache["cases"][case]["samples_s"], "number": 1}

    track_latency.unit = "seconds"

    def track_bandwidth(self, cache: dict[str, Any], case: str) -> float:
        gbps = cache["cases"][case]["gbps"]
        if gbps is None:
            raise SkipNotImplemented("no byte count for this case")
        return gbps

    track_bandwidth.unit = "GB/s"


def _progress(item: Any, status: str, fields: dict[str, Any]) -> None:
    t = (fields.get("timing") or {}).get("median_us")
    why = "" if status == "ok" else f" ({str(fields.get('reason', ''))[:100]})"
    lat = f" {t:.2f} us" if t is not None else ""
    print(f"  {status:7}{lat} {item.case_id} {item.backend}{why}", flush=True)


def _class_name(kernel: str, taken: set[str]) -> str:
    """The kernel's class name (frontends/asv/benchmarks.class_name), clear of this module's own names."""
    return class_name(kernel, taken, globals().keys())


def _setup_caches(kernels: list[str]) -> dict[str, Any]:
    """One setup_cache function per kernel, each on its own line of one generated source.

    asv keys a setup_cache by ``<module>:<line of its def>`` and runs it once per key, handing the
    result to every benchmark with that key; one shared function would give every kernel the first
    kernel's measurements. The source is registered in linecache (as dataclasses and attrs do for
    their generated code), so inspect finds the line numbers and asv can display the code.
    """
    src = "".join(
        f"def setup_cache_{i}(self):  # kernel {k!r}\n    return self._measure()\n\n"
        for i, k in enumerate(kernels)
    )
    filename = f"<dskbench-asv-setup-cache-{hashlib.sha1(src.encode()).hexdigest()[:10]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": __name__}
    exec(compile(src, filename, "exec"), namespace)
    return {k: namespace[f"setup_cache_{i}"] for i, k in enumerate(kernels)}


def _generate() -> None:
    kernels = list(_PLAN.kernels)
    functions = _setup_caches(kernels)
    taken: set[str] = set()
    for kernel in kernels:
        fn = functions[kernel]
        fn.timeout = setup_cache_timeout(len(_PLAN.kernels[kernel]), _CONFIG)
        name = _class_name(kernel, taken)
        globals()[name] = type(
            name,
            (_KernelBenchmark,),
            {
                "__module__": __name__,
                "__doc__": f"{kernel}: {len(_PLAN.kernels[kernel])} cases ({label(_CONFIG)})",
                "kernel": kernel,
                "params": [_PLAN.keys(kernel)],
                "setup_cache": fn,
            },
        )


_generate()
