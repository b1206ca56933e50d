"""Tensor-parallel communication: the all-reduce of [T, 7168] bf16 after attention and after the MLP
(twice per layer), and FlashInfer's all-reduce fused with the residual add and RMSNorm that follow it.

These kernels need one process per GPU (registry status needs-multi-gpu). The runner plans their cases
and skips each with the GPUs it needs; `dskbench comm`, started by torchrun, measures them with
the per-rank setups of dskbench.adapters.comm.setups (`RANK_SETUPS`), each built the way SGLang 0.5.16
builds it:

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

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import ANY_CUDA, CPU_OK, Backend, Requirement
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn, uniform
from dskbench.shapes.cases import Case, ModelShapes

DTYPE = torch.bfloat16
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
    raise RuntimeError("a collective: measured one process per GPU by `dskbench comm` under torchrun")


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
        gen = generator(seed)
        x = torch.empty(n, t, h, dtype=DTYPE, device=device)
        for r in range(n):  # one rank's slice at a time: no fp32 copy of all of them
            x[r] = randn((t, h), gen, device, DTYPE)
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
        gen = generator(seed + 1)
        inputs["residual"] = randn((t, h), gen, device, DTYPE)
        inputs["gamma"] = uniform((h,), gen, device, 0.5, 1.5, DTYPE)
        return inputs

    def reference(self, inputs: dict[str, Any], case: Case) -> Any:
        """(norm_out, residual_out): r = sum_ranks(x) + residual; y = r / rms(r) * gamma."""
        r = inputs["x"].float().sum(0) + inputs["residual"].float()
        eps = float(case.model["rms_norm_eps"])
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * inputs["gamma"].float()
        return y, r


def comm_cases(
    shapes: ModelShapes,
    kernel: str,
    world: int,
    phases: tuple[str, ...],
    profile: str = "full",
    tokens: list[int] | None = None,
) -> list[Case]:
    """The all_reduce op's cases at TP = world, for the phases' token lists (or `tokens`). The shapes
    file's tp list need not hold `world` (it lists 1, 4, 8; `dskbench comm` runs any world size)."""
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
