"""A worker process: runs plan items from a start index, one result line per item (see process.py).

Started by the engine, never by hand. It exits early (EXIT_POISONED) after an error that poisons the
CUDA context, so that the parent starts a clean process for the next item, and at once
(EXIT_ORPHANED) when its stdin closes: the parent is gone.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from dskbench.execution.process import EXIT_ORPHANED, EXIT_POISONED


def _exit_with_parent() -> None:
    """Block on stdin; its end means the parent died. os._exit works even while the main thread is
    stuck in a kernel launch or a synchronisation (they release the GIL)."""
    sys.stdin.read()
    os._exit(EXIT_ORPHANED)


def main(argv: list[str]) -> int:
    plan = json.loads(sys.stdin.readline())
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    start = int(argv[0])
    from dskbench.adapters.backends import DeviceInfo
    from dskbench.execution.case import run_one
    from dskbench.execution.items import SweepOptions, WorkItem

    items = [WorkItem(**i) for i in plan["items"]]
    opts = SweepOptions.from_json(plan["opts"])
    device = DeviceInfo.detect(opts.device)
    for item in items[start:]:
        print(f"BEGIN {item.index}", flush=True)
        fields = run_one(item, device, opts, plan["run_seed"], plan["ceilings"])
        poisoned = fields.pop("poisoned", False)
        print("RESULT " + json.dumps({"index": item.index, "fields": fields}, default=str), flush=True)
        if poisoned:
            print(f"NEXT {item.index + 1}", flush=True)
            return EXIT_POISONED
    print(f"NEXT {len(items)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
