"""A sweep's progress on stderr: a bar with rate and ETA on a terminal, one plain line per case
otherwise (a log file or CI keeps every case once, with no bar redrawn into it)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm


def case_line(item: Any, status: str, fields: dict[str, Any]) -> str:
    """One finished case: status, median (an ok case's only: an unstable one's is impossible), case id,
    backend, and why when it is not ok."""
    t = fields.get("timing") or {}
    med = t.get("median_us") if status == "ok" else None
    lat = f"{med:10.2f} us" if isinstance(med, int | float) else " " * 13
    why = "" if status == "ok" else f"  ({str(fields.get('reason', ''))[:80]})"
    return f"{status:8} {lat}  {item.case_id} · {item.backend}{why}"


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class Progress:
    """Called by the sweep once per finished case (the Recorder, under its lock).

    On a terminal: a tqdm bar (cases done, rate, elapsed and remaining time) showing the last case;
    a case that is not ok gets a line of its own above the bar. Off a terminal: one line per case,
    `[done/total eta M:SS] status median case · backend (reason)`. A closed stderr silences it: the
    measurement goes on."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream or sys.stderr
        self.total, self.done, self.clock = total, 0, clock
        # a terminal reporting no size (a bare pseudo-terminal) cannot show a bar: plain lines there
        self.tty = (self.stream.isatty() and _columns(self.stream) > 0) if tty is None else tty
        self.start = clock()
        self.quiet = False
        self.bar = (
            tqdm(total=total, file=self.stream, unit="case", dynamic_ncols=True, smoothing=0.05)
            if self.tty
            else None
        )

    def __call__(self, item: Any, status: str, fields: dict[str, Any]) -> None:
        self.done += 1
        if self.quiet:
            return
        line = case_line(item, status, fields)
        try:
            if self.bar is not None:
                if status != "ok":
                    self.bar.write(line, file=self.stream)
                self.bar.set_postfix_str(" ".join(line.split("  (")[0].split()), refresh=False)
                self.bar.update(1)
            else:
                self.stream.write(f"[{self.done}/{self.total}{self._eta()}] {line}\n")
                self.stream.flush()
        except (BrokenPipeError, ValueError):  # stderr closed (`2>&1 | head`): stay silent from now on
            self.quiet = True

    def _eta(self) -> str:
        """` eta M:SS` from the mean time per case so far (nothing before the first case or at the end)."""
        left = self.total - self.done
        if not self.done or left <= 0:
            return ""
        per_case = (self.clock() - self.start) / self.done
        return f" eta {tqdm.format_interval(per_case * left)}"

    def close(self) -> None:
        if self.bar is not None and not self.quiet:
            try:
                self.bar.close()
            except (BrokenPipeError, ValueError):
                pass
