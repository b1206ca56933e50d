"""Why is flashinfer's fp8_blockscale_gemm_sm90 `wrong` in the sweep? Try the scale layouts it accepts.

A sweep found it off the dequantized reference (results/h200x4-2026-11-21/README.md) with FP8 input +
[M, K/128] input scales + [N/128, K/128] weight scales (what the adapter passes). This prints the relative error, same inputs, for: (a) that call, (b) the weight scales
expanded to per-row [N, K/128], (c) BF16 input (the kernel quantizes it; what sglang's
`--fp8-gemm-backend flashinfer_deepgemm` passes) with block weight scales, (d) like (c) with per-row
weight scales. GPU (sm90) only.

    python3 scripts/probe_fi_blockscale.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch
    from flashinfer.gemm import fp8_blockscale_gemm_sm90 as fn

    from dskbench.adapters.base import rel_error
    from dskbench.adapters.common import fp8
    from dskbench.device.info import DeviceInfo
    from dskbench.results.environment import environment

    rows = []
    for m, n, k in ((1, 2112, 7168), (2, 2112, 7168), (4, 2112, 7168), (64, 7168, 2048), (512, 2112, 7168)):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn((m, k), generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.randn((n, k), generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        a, sa = fp8.per_token_group_quant(x)
        wq, sw = fp8.block_quant(w)
        w_deq = fp8.dequant_block(wq, sw)
        ref_q = fp8.dequant_per_token_group(a, sa) @ w_deq.t()  # W8A8 reference
        ref_x = x.float() @ w_deq.t()  # BF16 input x dequantized weight
        sw_rows = sw.repeat_interleave(fp8.GROUP, dim=0)[:n].contiguous()
        variants = [
            ("a: fp8 in, block w scales", (a, wq, sa, sw), ref_q),
            ("b: fp8 in, per-row w scales", (a, wq, sa, sw_rows), ref_q),
            ("c: bf16 in, block w scales", (x, wq, None, sw), ref_x),
            ("d: bf16 in, per-row w scales", (x, wq, None, sw_rows), ref_x),
        ]
        for name, call_args, ref in variants:
            try:
                out = fn(*call_args)
                torch.cuda.synchronize()
                err = rel_error(out, ref)
            except Exception as e:  # noqa: BLE001 - a refused layout is an answer too
                err = f"{type(e).__name__}: {e}"[:200]
            rows.append({"m": m, "n": n, "k": k, "variant": name, "rel_error": err})
            print(f"M={m:4d} N={n} K={k}  {name:32s} {err}", flush=True)
    if args.out:
        args.out.write_text(
            json.dumps({"environment": environment(DeviceInfo.detect()), "rows": rows}, indent=1, default=str)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
