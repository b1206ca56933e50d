"""One rank's side of a collective (`dskbench comm` runs one process per GPU): the rank's place in
the TP group, the set-up interface every backend implements, the NCCL baseline, and the peer-access checks
the custom all-reduces need before they start."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters.backends import Unavailable
from dskbench.shapes.cases import Case


@dataclass
class RankContext:
    """This process's place in the TP group. `device_group`: NCCL on GPUs (gloo on a CPU); `cpu_group`:
    gloo, for SGLang's setup exchanges and the timing agreement."""

    rank: int
    world: int
    device: torch.device
    device_group: Any
    cpu_group: Any
    max_tokens: int
    hidden: int


class RankCollective:
    """One backend set up on one rank: `bind` per case, `capture` around graph capture, `close`."""

    capturable = True

    def skip(self, inputs: dict[str, Any], case: Case) -> str | None:
        """Why this backend does not run this case (SGLang would use another path here), or None."""
        return None

    def detail(self, inputs: dict[str, Any], case: Case) -> str:
        return ""

    def bind(self, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        raise NotImplementedError

    def capture(self) -> Any:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


class TorchAllReduce(RankCollective):
    """dist.all_reduce in place (repeated launches grow the values; NCCL's speed does not depend on them)."""

    def __init__(self, ctx: RankContext, fn: Any = None):
        self.group = ctx.device_group

    def bind(self, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        import torch.distributed as dist

        x, group = inputs["x"], self.group

        def launch() -> torch.Tensor:
            dist.all_reduce(x, group=group)
            return x

        return launch


def trust_driver_p2p() -> None:
    """sglang's P2P test (custom_all_reduce_utils.gpu_p2p_access_check) asks sglang's own world group
    (parallel_state.get_world_group(), which asserts it was initialised) for the local rank; here the
    group is plain torch.distributed, so the test would fail every custom all-reduce's set-up. With
    SGLANG_SKIP_P2P_CHECK=1 sglang trusts the driver instead: torch.cuda.can_device_access_peer."""
    os.environ.setdefault("SGLANG_SKIP_P2P_CHECK", "1")


def need_peer_access(
    ctx: RankContext,
    can_access: Callable[[int, int], bool] | None = None,
    all_ranks: Callable[[bool], bool] | None = None,
) -> None:
    """Unavailable unless every GPU of the group can reach every other (the ranks of one host are GPUs
    0..world-1): the FlashInfer workspace maps the peers' memory, and without P2P its set-up or its
    first kernel would fail or wait for ever. Agreed over the CPU group before anything collective
    starts, so that every rank gives up or none does. `all_ranks(flag)`: True where every rank says so."""
    if ctx.device.type != "cuda":
        return
    can_access = can_access or torch.cuda.can_device_access_peer
    me = ctx.device.index if ctx.device.index is not None else ctx.rank
    blocked = [g for g in range(ctx.world) if g != me and not can_access(me, g)]
    if all_ranks is None:

        def all_ranks(flag: bool) -> bool:
            import torch.distributed as dist

            t = torch.tensor([1 if flag else 0], dtype=torch.int32)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=ctx.cpu_group)
            return bool(t.item())

    everywhere = all_ranks(not blocked)
    if blocked:
        raise Unavailable(f"GPU {me} has no peer access to GPU {', '.join(map(str, blocked))} (no P2P)")
    if not everywhere:
        raise Unavailable("another GPU of the group has no peer access (no P2P)")
