"""Results above 100% of a datasheet peak: not fast kernels but traffic-model errors.

A kernel cannot move more bytes per second than the GPU's HBM bandwidth, nor do more dense tensor
FLOPs per second than its datasheet rate. A record above either counts bytes or FLOPs its kernel does
not move or compute (padded or unrouted tokens, inputs assumed read but skipped, a cache-resident
operand counted as HBM traffic), so the adapter's `traffic()` needs fixing. The measured ceilings are no
such limit (a ceiling measured while throttled, or while another process used the GPU, sits below what
kernels reach), which is why the check reads the datasheet percentages only. A hot-mode result (inputs
left in L2 between launches) may beat the HBM bandwidth honestly, so only its compute rate is checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

LIMIT_PCT = 100.0
QUANTITIES = (("bandwidth", "pct_bw_datasheet", "gbps", "GB/s"), ("compute", "pct_compute_datasheet", "tflops", "TFLOP/s"))  # fmt: skip


@dataclass(frozen=True)
class OverPeak:
    """One ok result above a datasheet peak."""

    kernel: str
    backend: str
    op: str
    case_id: str
    quantity: str  # "bandwidth" or "compute"
    pct: float  # of the datasheet peak
    achieved: float | None
    unit: str

    def line(self) -> str:
        rate = f"{self.achieved:,.0f} {self.unit} = " if self.achieved is not None else ""
        return f"{self.kernel} · {self.backend} · {self.op}: {rate}{self.pct:.0f}% of the datasheet {self.quantity}"


def _num(x: Any) -> float | None:
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def over_peak(records: Iterable[Mapping[str, Any]], limit: float = LIMIT_PCT) -> list[OverPeak]:
    """The ok results above `limit` % of a datasheet peak, highest first (a result above both peaks is
    listed once per peak)."""
    out = []
    for r in records:
        m = r.get("metrics")
        if r.get("status") != "ok" or not isinstance(m, Mapping):
            continue
        hot = (r.get("timing") or {}).get("mode") == "hot"
        for quantity, key, rate, unit in QUANTITIES:
            if hot and quantity == "bandwidth":
                continue
            pct = _num(m.get(key))
            if pct is not None and pct > limit:
                op = str(r.get("op") or "-") + (f":{r['variant']}" if r.get("variant") else "")
                backend = str((r.get("backend") or {}).get("name", "-"))
                case = str(r.get("case_id") or r.get("kernel"))
                out.append(
                    OverPeak(str(r.get("kernel")), backend, op, case, quantity, pct, _num(m.get(rate)), unit)
                )
    return sorted(out, key=lambda o: (-o.pct, o.kernel, o.backend, o.case_id))


def summary(found: list[OverPeak], shown: int = 5) -> str | None:
    """One line for the end of a run: how many results are above a datasheet peak, the worst few."""
    if not found:
        return None
    head = (
        f"{len(found)} result(s) above 100% of the datasheet peak (a byte/FLOP model error in the adapter): "
    )
    more = f"; … and {len(found) - shown} more" if len(found) > shown else ""
    return head + "; ".join(o.line() for o in found[:shown]) + more
