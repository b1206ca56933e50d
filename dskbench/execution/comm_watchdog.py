"""The watchdog of a communication benchmark's rank: a rank stuck in a collective never returns, and every
rank of its group waits with it, so a phase that runs past its limit ends the process."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dskbench.execution.comm_plan import EXIT_HUNG, WHO


class Watchdog:
    """Ends this process when the phase it was armed for (a backend's set-up, one case, the teardown)
    runs past its limit: a rank stuck in a collective or a spinning kernel never returns, and every rank
    of the group waits with it. On expiry it calls the phase's `on_expire` (rank 0 records the case),
    dumps every thread's stack to stderr and exits with the phase's code; torchrun then stops the other
    ranks. A Python thread needs the GIL, so faulthandler's C-level timer backs it up 60 s later."""

    BACKSTOP_S = 60.0

    def __init__(
        self,
        exit: Callable[[int], Any] = os._exit,
        period: float = 0.5,
        backstop: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._exit, self._period, self._backstop, self._clock = exit, period, backstop, clock
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._what, self._on_expire, self._code, self._seconds = "", None, EXIT_HUNG, 0.0
        self.fired: str | None = None
        threading.Thread(target=self._loop, name="comm-bench-watchdog", daemon=True).start()

    def arm(
        self, seconds: float, what: str, on_expire: Callable[[], Any] | None = None, code: int = EXIT_HUNG
    ) -> None:
        if seconds is None or seconds <= 0:
            return self.disarm()
        with self._lock:
            self._deadline = self._clock() + seconds
            self._what, self._on_expire, self._code, self._seconds = what, on_expire, code, seconds
        if self._backstop:
            faulthandler.dump_traceback_later(seconds + self.BACKSTOP_S, exit=True)

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()

    def _loop(self) -> None:
        while True:
            time.sleep(self._period)
            with self._lock:
                expired = self._deadline is not None and self._clock() > self._deadline
                what, on_expire, code, seconds = self._what, self._on_expire, self._code, self._seconds
            if expired:
                self.fired = what
                print(
                    f"{WHO}: timed out: {what} gave no result within {seconds:g} s; ending this process",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    if on_expire is not None:
                        on_expire()
                except Exception as e:  # noqa: BLE001 - the exit matters more
                    print(f"{WHO}: recording the time-out failed: {e}", file=sys.stderr, flush=True)
                if self._backstop:
                    faulthandler.dump_traceback(all_threads=True)
                sys.stdout.flush()
                sys.stderr.flush()
                self._exit(code)
                return
