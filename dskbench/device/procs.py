"""The host's processes as /proc lists them, read one way for whoever needs them: the engine's hang
watch (a worker's compilers, a launcher's ranks) and the shared-GPU check (this run's own processes)."""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcStat(NamedTuple):
    pid: int
    name: str  # the command name, between the parentheses of /proc/PID/stat
    fields: list[str]  # the stat fields after the name: state, ppid, pgrp, ...

    @property
    def ppid(self) -> int:
        return int(self.fields[1])

    @property
    def live(self) -> bool:
        return self.fields[0] not in ("Z", "X")


def processes(proc_dir: str = "/proc") -> list[ProcStat]:
    """Every process in this PID namespace (none without /proc); one that ends while read is left out."""
    try:
        names = os.listdir(proc_dir)
    except OSError:
        return []
    out = []
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"{proc_dir}/{n}/stat") as fh:
                head, _, tail = fh.read().rpartition(")")
        except OSError:
            continue
        fields = tail.split()
        if head and len(fields) > 2 and fields[1].lstrip("-").isdigit():
            out.append(ProcStat(int(n), head.partition("(")[2], fields))
    return out
