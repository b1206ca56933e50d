"""The per-rank set-up of every collective backend, by (kernel, backend): what `dskbench comm` builds
on each rank after resolving the backend's target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dskbench.adapters.comm.custom_allreduce import SglangJitAllReduce, SglCustomAllReduce
from dskbench.adapters.comm.fusion import FlashInferFusion, NcclThenFusedAddRmsnorm
from dskbench.adapters.comm.rank import RankCollective, RankContext, TorchAllReduce

# (kernel, backend) -> class(ctx, resolved callable); `dskbench comm` resolves the backend's target first
RANK_SETUPS: dict[tuple[str, str], Callable[[RankContext, Any], RankCollective]] = {
    ("custom_all_reduce", "sgl_kernel"): SglCustomAllReduce,
    ("custom_all_reduce", "sglang_jit"): SglangJitAllReduce,
    ("custom_all_reduce", "nccl"): TorchAllReduce,
    ("flashinfer_communication_fusion", "flashinfer"): FlashInferFusion,
    ("flashinfer_communication_fusion", "nccl+fused_add_rmsnorm"): NcclThenFusedAddRmsnorm,
}
