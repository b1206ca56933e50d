"""Probe a GPU box: what the timing core can rely on (graph-captured timing events, NVML, profiler).

Run on the device: `python3 scripts/device_probe.py OUT.json`. Prints a short report.
"""

from __future__ import annotations

import json
import sys
import time


def main(out: str) -> None:
    import torch

    info: dict = {"torch": torch.__version__, "cuda": torch.version.cuda}
    p = torch.cuda.get_device_properties(0)
    info.update(
        name=p.name,
        sm=f"{p.major}.{p.minor}",
        sms=p.multi_processor_count,
        l2=getattr(p, "L2_cache_size", None),
        mem_gib=round(p.total_memory / 2**30, 1),
    )
    # 1. timing events recorded inside a captured graph (external=True)
    x = torch.randn(1 << 16, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    try:
        evs = [
            (
                torch.cuda.Event(enable_timing=True, external=True),
                torch.cuda.Event(enable_timing=True, external=True),
            )
            for _ in range(20)
        ]
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x * 2
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                for a, b in evs:
                    flush.fill_(1)
                    a.record()
                    y.mul_(1.0001)
                    b.record()
        g.replay()
        torch.cuda.synchronize()
        info["graph_event_us"] = [round(a.elapsed_time(b) * 1000, 3) for a, b in evs]
    except Exception as e:  # noqa: BLE001
        info["graph_event_error"] = f"{type(e).__name__}: {e}"
    # 2. NVML
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info["nvml"] = {
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "sm_clock": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
        }
    except Exception as e:  # noqa: BLE001
        info["nvml_error"] = f"{type(e).__name__}: {e}"
    # 3. import costs
    for mod in ("sgl_kernel", "flashinfer", "sglang"):
        t = time.time()
        try:
            __import__(mod)
            info[f"import_{mod}_s"] = round(time.time() - t, 2)
        except Exception as e:  # noqa: BLE001
            info[f"import_{mod}_error"] = f"{type(e).__name__}: {e}"[:300]
    json.dump(info, open(out, "w"), indent=1)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
