"""The all-reduce fused with the residual add and RMSNorm on one rank: flashinfer.comm.allreduce_fusion,
and the unfused path it replaces (NCCL all-reduce, then fused_add_rmsnorm)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters.comm.allreduce import DTYPE
from dskbench.adapters.comm.rank import RankCollective, RankContext, need_peer_access
from dskbench.shapes.cases import Case

# sglang 0.5.16 fuses only batches of at most FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048 tokens
# (layers/communicator.py), in a workspace of max_token_num = 2048 (flashinfer_comm_fusion.py)
FUSION_MAX_TOKENS = 2048


class FlashInferFusion(RankCollective):
    """flashinfer.comm.allreduce_fusion with residual + RMSNorm; one TRT-LLM workspace for the sweep."""

    def __init__(self, ctx: RankContext, fn: Any = None):
        need_peer_access(ctx)
        import flashinfer.comm as comm

        self.comm, self.world = comm, ctx.world
        # flashinfer 0.6.14: a torch symmetric-memory workspace (multicast off under
        # TORCH_SYMM_MEM_DISABLE_MULTICAST), rendezvous and barrier on `group`; builds the trtllm_comm JIT
        self.ws = comm.create_allreduce_fusion_workspace(
            backend="trtllm",  # never "mnnvl"/"auto": the MNNVL workspace creates a multicast object
            world_size=ctx.world,
            rank=ctx.rank,
            max_token_num=FUSION_MAX_TOKENS,  # as sglang: the workspace it fuses in
            hidden_dim=ctx.hidden,
            dtype=DTYPE,
            gpus_per_node=ctx.world,
            group=ctx.device_group,
        )

    def skip(self, inputs: dict[str, Any], case: Case) -> str | None:
        t, h = inputs["x"].shape
        if t > FUSION_MAX_TOKENS:
            return (
                f"T={t} is over SGLang's {FUSION_MAX_TOKENS}-token fusion limit: SGLang runs NCCL + the norm"
            )
        if self.ws.is_buffer_size_sufficient(self.world, t, h, DTYPE):
            return None
        return f"T={t} does not fit the fusion workspace"

    def bind(self, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x, res, gamma = inputs["x"], inputs["residual"], inputs["gamma"]
        res_out, norm_out = torch.empty_like(res), torch.empty_like(x)
        comm, ws = self.comm, self.ws
        pattern = comm.AllReduceFusionPattern.kARResidualRMSNorm
        eps = float(case.model["rms_norm_eps"])

        def launch() -> tuple[torch.Tensor, torch.Tensor]:
            comm.allreduce_fusion(
                input=x,
                workspace=ws,
                pattern=pattern,
                launch_with_pdl=True,
                trigger_completion_at_end=False,
                residual_out=res_out,
                norm_out=norm_out,
                residual_in=res,
                rms_gamma=gamma,
                rms_eps=eps,
                use_oneshot=None,
                fp32_acc=False,
            )
            return norm_out, res_out

        return launch

    def close(self) -> None:
        self.ws.destroy()


class NcclThenFusedAddRmsnorm(RankCollective):
    """NCCL all-reduce, then fused_add_rmsnorm (in place: residual += x; x = rmsnorm(residual) * gamma)."""

    def __init__(self, ctx: RankContext, fn: Any):
        self.group, self.norm = ctx.device_group, fn

    def bind(self, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        import torch.distributed as dist

        x, res, gamma, group, norm = inputs["x"], inputs["residual"], inputs["gamma"], self.group, self.norm
        eps = float(case.model["rms_norm_eps"])

        def launch() -> tuple[torch.Tensor, torch.Tensor]:
            dist.all_reduce(x, group=group)
            norm(x, res, gamma, eps)
            return x, res

        return launch
