"""The planner subprocess: `python -m dskbench.frontends.suite plan OUT.json < config.json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from dskbench.execution.config import RunConfig
    from dskbench.frontends.suite.config import SuiteError
    from dskbench.frontends.suite.plan import make_plan

    if len(argv) == 2 and argv[0] == "plan":
        config = RunConfig.from_json(json.loads(sys.stdin.read()))
        try:
            plan = make_plan(config)
        except SuiteError as e:
            print(f"dskbench.frontends.suite: {e}", file=sys.stderr)
            return 2
        Path(argv[1]).write_text(json.dumps(plan.to_json()))
        return 0
    print("usage: python -m dskbench.frontends.suite plan OUT.json < config.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
