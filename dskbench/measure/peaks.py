"""Datasheet peaks per GPU: HBM bandwidth and dense (no 2:4 sparsity) tensor-core rates.

Leads, not ceilings: METHOD.md asks for measured ceilings (ceilings.py) and these only say how far those
are from the brochure. NVIDIA quotes tensor rates "with sparsity"; the dense rate is half. Sources:
- H100 SXM / PCIe / NVL: NVIDIA H100 Tensor Core GPU datasheet. SXM: 3.35 TB/s, BF16 1,979 / FP8 3,958
  TFLOPS with sparsity. PCIe: 2.0 TB/s, 1,513 / 3,026. NVL: 3.9 TB/s, 1,671 / 3,341. No FP4.
- H200 SXM / NVL: NVIDIA H200 Tensor Core GPU datasheet. 4.8 TB/s; SXM BF16 1,979 / FP8 3,958 with
  sparsity; NVL 1,671 / 3,341. No FP4.
- B200: NVIDIA DGX B200 datasheet (8 GPUs): 64 TB/s HBM3e; FP4 144 PFLOPS sparse / 72 dense; FP8 72
  PFLOPS sparse; FP16/BF16 36 PFLOPS sparse. Per GPU, dense: 8 TB/s, FP4 9, FP8 4.5, BF16 2.25 PFLOPS.
- GB200: NVIDIA GB200 NVL72 datasheet (72 GPUs): 576 TB/s HBM3e; FP4 1,440 PFLOPS sparse / 720 dense;
  FP8 720 PFLOPS sparse; FP16/BF16 360 PFLOPS sparse. Per GPU, dense: 8 TB/s, FP4 10, FP8 5, BF16 2.5.
"""

from __future__ import annotations

import re
from typing import Any

# (pattern on the lower-cased device name, tried in order; first match wins)
_PEAKS: list[tuple[str, dict[str, Any]]] = [
    (r"\bgb200\b", {"name": "GB200", "hbm_gbps": 8000.0, "bf16_tflops": 2500.0, "fp8_tflops": 5000.0, "fp4_tflops": 10000.0}),
    (r"\bb200\b", {"name": "B200", "hbm_gbps": 8000.0, "bf16_tflops": 2250.0, "fp8_tflops": 4500.0, "fp4_tflops": 9000.0}),
    (r"\bh200\b.*\bnvl\b", {"name": "H200 NVL", "hbm_gbps": 4800.0, "bf16_tflops": 835.5, "fp8_tflops": 1670.5, "fp4_tflops": None}),
    (r"\bh200\b", {"name": "H200 SXM", "hbm_gbps": 4800.0, "bf16_tflops": 989.5, "fp8_tflops": 1979.0, "fp4_tflops": None}),
    (r"\bh100\b.*\bpcie\b", {"name": "H100 PCIe", "hbm_gbps": 2000.0, "bf16_tflops": 756.5, "fp8_tflops": 1513.0, "fp4_tflops": None}),
    (r"\bh100\b.*\bnvl\b", {"name": "H100 NVL", "hbm_gbps": 3900.0, "bf16_tflops": 835.5, "fp8_tflops": 1670.5, "fp4_tflops": None}),
    (r"\bh100\b.*(\bsxm|\bhbm3\b)", {"name": "H100 SXM", "hbm_gbps": 3350.0, "bf16_tflops": 989.5, "fp8_tflops": 1979.0, "fp4_tflops": None}),
]  # fmt: skip


def datasheet_peaks(gpu_name: str | None) -> dict[str, Any] | None:
    """Dense datasheet peaks for a device name as torch/NVML report it ("NVIDIA H100 80GB HBM3",
    "NVIDIA H200", "NVIDIA B200", "NVIDIA GB200"); None for anything not in the table."""
    if not gpu_name:
        return None
    low = gpu_name.lower()
    for pattern, peaks in _PEAKS:
        if re.search(pattern, low):
            return {**peaks, "source": "NVIDIA datasheet, dense (sparsity figures halved)"}
    return None
