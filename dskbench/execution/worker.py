"""A worker process: runs plan items, one result line per item (see process.py).

Started by the engine, never by hand. It runs the items its plan lists under `todo` (all of them when
absent), in that order; in a run that builds ahead, those whose JIT build is not done yet wait, and a
worker with none ready says ``WAIT`` now and then (execution/build_ahead.py). Cases to be timed cold are held and timed together (execution/batching.py), except those listed
under `solo`: the parent lists there the cases of a batch whose worker died, so that each is timed alone
and a crash is pinned on its own case. It exits early (EXIT_POISONED) after an error that poisons the
CUDA context, so that the parent starts a clean process for what is left, and at once (EXIT_ORPHANED)
when its stdin closes: the parent is gone.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from dskbench.execution.process import EXIT_ORPHANED, EXIT_POISONED


def _exit_with_parent() -> None:
    """Block on stdin; its end means the parent died. os._exit works even while the main thread is
    stuck in a kernel launch or a synchronisation (they release the GIL)."""
    sys.stdin.read()
    os._exit(EXIT_ORPHANED)


def say(kind: str, payload: Any) -> None:
    print(f"{kind} {payload}", flush=True)


def result(index: int, fields: dict[str, Any]) -> bool:
    """Report one item's record fields; True when its error poisoned the CUDA context."""
    poisoned = fields.pop("poisoned", False)
    say("RESULT", json.dumps({"index": index, "fields": fields}, default=str))
    return bool(poisoned)


def main(argv: list[str]) -> int:
    plan = json.loads(sys.stdin.readline())
    if plan.get("nice"):  # a builder: it and its compilers yield the CPU to the measuring (warm.BUILD_NICE)
        os.nice(int(plan["nice"]))
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    from dskbench.device.info import DeviceInfo
    from dskbench.execution import batching, build_ahead, heap, host_threads
    from dskbench.execution.case import free_memory, run_one
    from dskbench.execution.items import SweepOptions, WorkItem

    heap.defer_full_collections()
    items = [WorkItem(**i) for i in plan["items"]]
    todo = plan.get("todo")
    if todo is None:
        todo = list(range(int(argv[0]) if argv else 0, len(items)))
    solo = set(plan.get("solo") or ())
    opts = SweepOptions.from_json(plan["opts"])
    device = DeviceInfo.detect(opts.device)
    host_threads.limit_for_gpu_run(device.kind, plan.get("threads"))  # a builder's plan names fewer
    ceilings = plan["ceilings"]
    batcher: batching.Batcher | None = None
    asked = False
    poisoned = False

    def offer(item: WorkItem, base: dict[str, Any], prep: Any, seconds: float) -> bool:
        """Hold a prepared case for a batch (decided at the first case: the adapters are loaded then)."""
        nonlocal batcher, asked
        if not asked:
            asked = True
            if batching.enabled(device, opts):
                batcher = batching.Batcher(device, opts, ceilings)
        return batcher is not None and batcher.offer(item, base, prep, seconds)

    def emit(item: WorkItem, fields: dict[str, Any]) -> None:
        nonlocal poisoned
        poisoned = result(item.index, fields) or poisoned

    def time_held() -> bool:
        """Time the held cases; False when the CUDA context broke under them (the worker must exit)."""
        if batcher is None or not batcher.held:
            return True
        say("TIMING", len(batcher.held))
        try:
            batcher.time_all(emit)
            free_memory(device, force=True)
            heap.freeze_after_imports()
        except Exception as e:  # noqa: BLE001 - only a poisoning error gets here
            print(f"dskbench worker: a batch broke the CUDA context: {e}", file=sys.stderr, flush=True)
            return False
        return not poisoned

    broke = False  # a batch timed to make room broke the CUDA context: the worker must exit
    current = -1  # the item being run

    def make_room() -> bool:
        """Time and free the held cases, for a case that ran out of GPU memory beside them; the case then
        begins again (its own time limit, not what the batch left of it)."""
        nonlocal broke
        if batcher is None or not batcher.held:
            return False
        broke = not time_held()
        if not broke:
            say("BEGIN", current)
        return not broke

    ready_file = plan.get(build_ahead.READY_KEY)
    order = (
        build_ahead.build_order(todo, items, build_ahead.ReadyFile(ready_file)) if ready_file else iter(todo)
    )
    for idx in order:
        if idx is None:  # no case whose build is done: time the held ones, then wait for a build
            if not time_held():
                return EXIT_POISONED
            say("WAIT", "builds")
            continue
        item, current = items[idx], idx
        say("BEGIN", idx)
        hold = None if idx in solo else offer
        fields = run_one(item, device, opts, plan["run_seed"], ceilings, hold=hold, make_room=make_room)
        if fields is None:
            say("HELD", idx)
            if batcher is not None and batcher.full() and not time_held():
                return EXIT_POISONED
            continue
        if result(idx, fields) or broke:
            return EXIT_POISONED  # the held cases are re-run by the next worker
        if batcher is None or not batcher.held:  # no case's tensors alive: the imports' objects alone
            heap.freeze_after_imports()
    if not time_held():
        return EXIT_POISONED
    say("NEXT", len(items))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
