"""Worker process of a sweep: runs plan items from a start index, one result line per item.

Run by dskbench.runner, never by hand. It exits early (code 3) after an error that poisons the CUDA
context, so that the parent can start a clean process for the next item.
"""

from __future__ import annotations

import json
import sys

from dskbench.backends import DeviceInfo
from dskbench.runner import EXIT_POISONED, SweepOptions, WorkItem, run_one


def main(argv: list[str]) -> int:
    plan = json.loads(open(argv[0]).read())
    start = int(argv[1])
    items = [WorkItem(**i) for i in plan["items"]]
    opts = SweepOptions(
        **{
            **plan["opts"],
            "phases": tuple(plan["opts"]["phases"]),
            "tp": tuple(plan["opts"]["tp"]),
            "costs_from": tuple(plan["opts"].get("costs_from", ())),
        }
    )
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
