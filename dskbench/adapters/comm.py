"""Tensor-parallel communication: the all-reduce of [T, 7168] bf16 after attention and after the MLP
(twice per layer), and FlashInfer's all-reduce fused with the residual add and RMSNorm that follow it.

These kernels need one process per GPU (registry status needs-multi-gpu). The runner plans their cases
and skips each with the GPUs it needs; scripts/comm_bench.py, started by torchrun, measures them with
the per-rank setups below (`RANK_SETUPS`), each built the way SGLang 0.5.16 builds it:

* custom_all_reduce / sgl_kernel: SGLang's CustomAllreduce (v1, sgl_kernel AOT ops over cudaIpc
  buffers); in CUDA graphs the input is registered, eager it is copied into the IPC buffer. Both custom
  all-reduces run with SGLANG_SKIP_P2P_CHECK=1 (their P2P test needs sglang's own process groups; the
  driver's peer-access report is trusted instead) on the gloo group, as SGLang builds them.
* custom_all_reduce / sglang_jit: SGLang's CustomAllReduceV2 (JIT, symmetric memory), the default on
  CUDA in 0.5.16; its tuned graph-mode config picks the algorithm per size.
* custom_all_reduce / nccl: torch.distributed.all_reduce on the NCCL group (the baseline, in place).
* flashinfer_communication_fusion / flashinfer: flashinfer.comm.allreduce_fusion, pattern
  kARResidualRMSNorm, TRT-LLM workspace, PDL on, as sglang's flashinfer_allreduce_residual_rmsnorm.
* flashinfer_communication_fusion / nccl+fused_add_rmsnorm: the unfused path (NCCL all-reduce, then
  flashinfer.norm.fused_add_rmsnorm in place).

Size limits are SGLang's: a size its custom all-reduce would hand to NCCL is skipped with that reason,
and so is a token count above 2048 for the fusion (SGLang fuses only up to FUSE_ALLREDUCE_MAX_BATCH_SIZE
tokens, with a workspace of 2048 tokens; above that it runs the unfused path).
The FlashInfer workspace is created with backend "trtllm" (not "mnnvl" or "auto", whose MNNVL path
calls cuMulticastCreate). NVLink multicast in NCCL (NVLS) and torch's symmetric memory is as the host
has it, or off in every rank under DSKBENCH_NO_MULTICAST=1 (dskbench.results.environment.NO_MULTICAST_ENV); the
results' environment record says which.

Traffic counts bus bytes per rank, 2(n-1)/n x payload (nccl-tests' convention), so GB/s is bus
bandwidth for all five; the fused kernel's local residual/norm bytes (3 x T x H x 2) are not added.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import ANY_CUDA, CPU_OK, Backend, Requirement, Unavailable
from dskbench.adapters.base import Adapter, Traffic
from dskbench.shapes.cases import Case, ModelShapes

DTYPE = torch.bfloat16
RMS_EPS = 1e-6  # rms_norm_eps of the model config
# sglang 0.5.16 fuses only batches of at most FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048 tokens
# (layers/communicator.py), in a workspace of max_token_num = 2048 (flashinfer_comm_fusion.py)
FUSION_MAX_TOKENS = 2048
SM90_SM100 = Requirement(sm=(90, 100, 103))  # flashinfer's trtllm_comm module: majors 9 and 10


def payload_bytes(case: Case) -> int:
    """Bytes each rank contributes: T x H bf16."""
    return int(case.dims["T"]) * int(case.dims["H"]) * 2


def bus_bytes(payload: int, world: int) -> float:
    """Bytes each rank sends (and receives) in a bandwidth-optimal all-reduce: 2(n-1)/n x payload."""
    return 2.0 * (world - 1) / world * payload


def algbw_gbps(payload: int, latency_us: float) -> float:
    """Algorithm bandwidth: payload over time (nccl-tests' algbw)."""
    return payload / (latency_us * 1e-6) / 1e9


def busbw_gbps(payload: int, world: int, latency_us: float) -> float:
    """Bus bandwidth: algbw x 2(n-1)/n, comparable across world sizes (nccl-tests' busbw)."""
    return bus_bytes(payload, world) / (latency_us * 1e-6) / 1e9


def _needs_ranks(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    raise RuntimeError("a collective: measured one process per GPU by scripts/comm_bench.py under torchrun")


def _backend(
    name: str, target: str, package: str, kind: str, requires: Requirement, note: str, **kw
) -> Backend:
    return Backend(name, target, package, kind, _needs_ranks, requires=requires, note=note, **kw)


class _AllReduce(Adapter):
    """[world, T, H] inputs: rank r's contribution is x[r]; every rank builds all of them from one seed,
    so each can check its result against the whole sum without communicating."""

    role = "allreduce"
    ops = ("all_reduce",)

    def applies(self, case: Case) -> bool:
        return int(case.dims["world"]) >= 2  # at tp 1 there is nothing to reduce

    def gpus_needed(self, case: Case) -> int:
        return int(case.dims["world"])

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        t, h, n = (int(case.dims[k]) for k in ("T", "H", "world"))
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.empty(n, t, h, dtype=DTYPE, device=device)
        for r in range(n):
            x[r] = torch.randn(t, h, generator=g, device=device, dtype=DTYPE)
        return {"x": x}

    def rank_inputs(self, inputs: dict[str, Any], rank: int) -> dict[str, Any]:
        """This rank's own tensors (fresh copies: the in-place baselines write into them)."""
        out = {"x": inputs["x"][rank].clone()}
        for k in ("residual", "gamma"):
            if k in inputs:
                out[k] = inputs[k].clone()
        return out

    def reference(self, inputs: dict[str, Any], case: Case) -> Any:
        return inputs["x"].float().sum(0)

    def traffic(self, case: Case) -> Traffic:
        world = int(case.dims["world"])
        return Traffic(
            bytes=int(bus_bytes(payload_bytes(case), world)),
            flops=int(case.dims["T"]) * int(case.dims["H"]) * (world - 1),
            note="bus bytes per rank, 2(n-1)/n x T x H x 2 (nccl-tests busbw); FLOPs: the additions",
        )


@register
class CustomAllReduce(_AllReduce):
    kernel = "custom_all_reduce"
    description = "TP all-reduce of the hidden states (SGLang custom all-reduce, NCCL baseline)"
    backends = [
        _backend(
            "sgl_kernel",
            "sgl_kernel.allreduce:all_reduce",
            "sglang-kernel",
            "aot",
            ANY_CUDA,
            "sglang CustomAllreduce (v1): cudaIpc buffers, registered graph inputs",
        ),
        _backend(
            "sglang_jit",
            "sglang.jit_kernel.all_reduce:custom_all_reduce",
            "sglang",
            "jit",
            ANY_CUDA,
            "sglang CustomAllReduceV2 (default on CUDA in 0.5.16): symmetric memory, tuned algorithms",
        ),
        _backend(
            "nccl",
            "torch.distributed:all_reduce",
            "torch",
            "torch",
            CPU_OK,  # gloo on a CPU: lets the collective path run in tests
            "torch.distributed.all_reduce, in place (NCCL on GPUs: the baseline)",
            label="NCCL baseline",
        ),
    ]


@register
class FlashInferCommFusion(_AllReduce):
    kernel = "flashinfer_communication_fusion"
    description = "all-reduce + residual add + RMSNorm in one kernel (flashinfer.comm), vs NCCL then the norm"
    backends = [
        _backend(
            "flashinfer",
            "flashinfer.comm:allreduce_fusion",
            "flashinfer-python",
            "jit",
            SM90_SM100,
            "allreduce_fusion kARResidualRMSNorm, trtllm workspace, launch_with_pdl",
        ),
        _backend(
            "nccl+fused_add_rmsnorm",
            "flashinfer.norm:fused_add_rmsnorm",
            "flashinfer-python",
            "jit",
            ANY_CUDA,
            "the unfused path: NCCL all-reduce, then fused_add_rmsnorm in place",
            label="NCCL baseline",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        inputs = super().make_inputs(case, device, seed)
        t, h = int(case.dims["T"]), int(case.dims["H"])
        g = torch.Generator(device=device).manual_seed(seed + 1)
        inputs["residual"] = torch.randn(t, h, generator=g, device=device, dtype=DTYPE)
        inputs["gamma"] = (torch.rand(h, generator=g, device=device) + 0.5).to(DTYPE)
        return inputs

    def reference(self, inputs: dict[str, Any], case: Case) -> Any:
        """(norm_out, residual_out): r = sum_ranks(x) + residual; y = r / rms(r) * gamma."""
        r = inputs["x"].float().sum(0) + inputs["residual"].float()
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + RMS_EPS) * inputs["gamma"].float()
        return y, r


# -- one rank's side (scripts/comm_bench.py) ---------------------------------------------------------------


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


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


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


def _trust_driver_p2p() -> None:
    """sglang's P2P test (custom_all_reduce_utils.gpu_p2p_access_check) asks sglang's own world group
    (parallel_state.get_world_group(), which asserts it was initialised) for the local rank; here the
    group is plain torch.distributed, so the test would fail every custom all-reduce's set-up. With
    SGLANG_SKIP_P2P_CHECK=1 sglang trusts the driver instead: torch.cuda.can_device_access_peer."""
    os.environ.setdefault("SGLANG_SKIP_P2P_CHECK", "1")


def _need_peer_access(
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
        _trust_driver_p2p()
        _need_peer_access(ctx)  # sglang's own check is per rank: agree first
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
        _trust_driver_p2p()
        _need_peer_access(ctx)  # sglang's own check is per rank: agree first
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


class FlashInferFusion(RankCollective):
    """flashinfer.comm.allreduce_fusion with residual + RMSNorm; one TRT-LLM workspace for the sweep."""

    def __init__(self, ctx: RankContext, fn: Any = None):
        _need_peer_access(ctx)
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
                rms_eps=RMS_EPS,
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

        def launch() -> tuple[torch.Tensor, torch.Tensor]:
            dist.all_reduce(x, group=group)
            norm(x, res, gamma, RMS_EPS)
            return x, res

        return launch


# (kernel, backend) -> class(ctx, resolved callable); comm_bench resolves the backend's target first
RANK_SETUPS: dict[tuple[str, str], Callable[[RankContext, Any], RankCollective]] = {
    ("custom_all_reduce", "sgl_kernel"): SglCustomAllReduce,
    ("custom_all_reduce", "sglang_jit"): SglangJitAllReduce,
    ("custom_all_reduce", "nccl"): TorchAllReduce,
    ("flashinfer_communication_fusion", "flashinfer"): FlashInferFusion,
    ("flashinfer_communication_fusion", "nccl+fused_add_rmsnorm"): NcclThenFusedAddRmsnorm,
}


def comm_cases(
    shapes: ModelShapes,
    kernel: str,
    world: int,
    phases: tuple[str, ...],
    profile: str = "full",
    tokens: list[int] | None = None,
) -> list[Case]:
    """The all_reduce op's cases at TP = world, for the phases' token lists (or `tokens`). The shapes
    file's tp list need not hold `world` (it lists 1, 4, 8; comm_bench runs any world size)."""
    op = shapes.ops["all_reduce"]
    out = []
    for phase in phases:
        family = shapes.phase_family(phase)
        if family not in op.phases:
            continue
        values = tokens or shapes.values(shapes.phases[phase]["T"], profile)
        for t in values:
            for var in op.roles["allreduce"]:
                point = {"T": int(t), "tp": world}
                dims = shapes.eval_role(var, point)
                variant = dims.pop("variant", None)
                out.append(Case(kernel, "all_reduce", phase, point, dims, variant, dict(shapes.config)))
    return out
