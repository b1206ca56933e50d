"""SGLang's two custom all-reduces set up on one rank: CustomAllreduce (v1, sgl_kernel AOT ops over
cudaIpc buffers) and CustomAllReduceV2 (JIT, symmetric memory), with the sizes each hands to NCCL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters.backends import Unavailable
from dskbench.adapters.comm.rank import RankCollective, RankContext, need_peer_access, trust_driver_p2p
from dskbench.shapes.cases import Case


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


class _SglangAllReduce(RankCollective):
    """What sglang's two custom all-reduces share once set up (`self.ca`): the call, the capture
    context their graph buffers need, and the clean-up."""

    ca: Any

    def bind(self, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        x, ca = inputs["x"], self.ca
        return lambda: ca.custom_all_reduce(x)

    def capture(self) -> Any:
        return self.ca.capture()

    def close(self) -> None:
        self.ca.close()


class SglCustomAllReduce(_SglangAllReduce):
    """sglang's CustomAllreduce (v1 over sgl_kernel's AOT ops)."""

    def __init__(self, ctx: RankContext, fn: Any = None):
        trust_driver_p2p()
        need_peer_access(ctx)  # sglang's own check is per rank: agree first
        from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce

        self.ca = CustomAllreduce(group=ctx.cpu_group, device=ctx.device)
        if self.ca.disabled:
            raise Unavailable("sglang CustomAllreduce disabled itself here (it needs full NVLink and P2P)")

    def skip(self, inputs: dict[str, Any], case: Case) -> str | None:
        x = inputs["x"]
        if self.ca.should_custom_ar(x):
            return None
        return f"{_nbytes(x) / 2**20:.1f} MiB is over CustomAllreduce's {self.ca.max_size / 2**20:.0f} MiB: SGLang uses NCCL"


class SglangJitAllReduce(_SglangAllReduce):
    """sglang's CustomAllReduceV2 (JIT): the algorithm its graph-mode config picks for the size."""

    def __init__(self, ctx: RankContext, fn: Any = None):
        trust_driver_p2p()
        need_peer_access(ctx)  # sglang's own check is per rank: agree first
        from sglang.srt.distributed.device_communicators.custom_all_reduce_v2 import CustomAllReduceV2

        self.ca = CustomAllReduceV2(group=ctx.cpu_group, device=ctx.device)
        if self.ca.disabled:
            raise Unavailable("sglang CustomAllReduceV2 disabled itself here (it needs full NVLink)")

    def _algo(self, x: torch.Tensor, graph: bool = True) -> Any:
        algo, _mode = self.ca._pick_algo(_nbytes(x), can_use_graph=graph)  # timed in CUDA graphs
        return algo

    def skip(self, inputs: dict[str, Any], case: Case) -> str | None:
        x = inputs["x"]
        # eager launches (the check, warm-up, an eager fallback) use the eager config: a size it has no
        # algorithm for fails an assert in custom_all_reduce, so both configs must take the size
        for graph, name in ((True, "graph"), (False, "eager")):
            if self._algo(x, graph) is None:
                return (
                    f"{_nbytes(x) / 2**20:.1f} MiB: CustomAllReduceV2's {name} config hands this size to NCCL"
                )
        if _nbytes(x) > self.ca.max_size:
            return (
                f"{_nbytes(x) / 2**20:.1f} MiB is over CustomAllReduceV2's {self.ca.max_size / 2**20:.0f} MiB"
            )
        return None

    def detail(self, inputs: dict[str, Any], case: Case) -> str:
        algo = self._algo(inputs["x"])
        return f"algo {algo.algo_name}" if algo is not None else ""
