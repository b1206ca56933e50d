"""The CUTLASS MoE bookkeeping: prepare_moe_input and get_cutlass_w4a8_moe_mm_data turn
topk_ids into expert offsets, per-expert problem sizes and the gather/scatter permutations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check
from dskbench.adapters.common.routing import expert_counts, sorted_by_expert
from dskbench.adapters.moe.inputs import routing, topk
from dskbench.adapters.moe.reference import check_segments, torch_op
from dskbench.shapes.cases import Case


def _prepare_outputs(t: int, k: int, e: int, device: torch.device) -> list[torch.Tensor]:
    i32 = torch.int32
    return [
        torch.empty(e + 1, dtype=i32, device=device),
        torch.empty(e, 3, dtype=i32, device=device),
        torch.empty(e, 3, dtype=i32, device=device),
        torch.empty(t * k, dtype=i32, device=device),
        torch.empty(t * k, dtype=i32, device=device),
    ]


def _bind_prepare(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    ids = inputs["topk_ids"]
    t, k = ids.shape
    e, n, hk = int(case.dims["E"]), int(case.dims["I"]), int(case.dims["H"])
    offsets, ps1, ps2, a_map, c_map = _prepare_outputs(t, k, e, ids.device)

    def launch() -> tuple[torch.Tensor, ...]:
        fn(ids, offsets, None, ps1, ps2, a_map, c_map, e, n, hk)
        return offsets, ps1, ps2, a_map, c_map

    return launch


def prepare_reference(
    topk_ids: torch.Tensor, num_experts: int, n: int, k: int, swapped: bool = False
) -> tuple[torch.Tensor, ...]:
    """Canonical (expert_offsets [E+1], problem_sizes1/2 [E,3], input_permutation, output_permutation,
    flat expert id of each (token, slot) [T*K], the last for checks).

    Problem sizes are (m_e, 2n, k) / (m_e, k, n); ``swapped`` gives the W4A8 kernels' (2n, m_e, k) /
    (k, m_e, n). input_permutation[r] = token of row r (expert order), output_permutation = its inverse map
    from flat (token, slot) to row.
    """
    counts = expert_counts(topk_ids, num_experts).to(torch.int32)
    order, offsets = sorted_by_expert(topk_ids, num_experts)
    kk = topk_ids.shape[1]
    ps1 = torch.stack([counts, torch.full_like(counts, 2 * n), torch.full_like(counts, k)], dim=1)
    ps2 = torch.stack([counts, torch.full_like(counts, k), torch.full_like(counts, n)], dim=1)
    if swapped:
        ps1, ps2 = ps1[:, [1, 0, 2]], ps2[:, [1, 0, 2]]
    in_perm = (order // kk).to(torch.int32)
    out_perm = torch.empty_like(in_perm)
    out_perm[order] = torch.arange(order.numel(), dtype=torch.int32)
    flat_ids = topk_ids.flatten().long().cpu()
    return offsets.to(torch.int32), ps1.contiguous(), ps2.contiguous(), in_perm, out_perm, flat_ids


@register
class PrepareMoeInput(Adapter):
    kernel = "prepare_moe_input"
    role = "moe"
    ops = ("experts",)
    description = "CUTLASS MoE bookkeeping: expert offsets, problem sizes, gather/scatter permutations"
    backends = [
        Backend(
            "sgl_kernel", torch_op("prepare_moe_input"), None, "aot", _bind_prepare, preload=("sgl_kernel",)
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"topk_ids": routing(case, device, seed).topk_ids}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        d = case.dims
        return prepare_reference(inputs["topk_ids"], int(d["E"]), int(d["I"]), int(d["H"]))

    def reference_output(self, ref: Any) -> Any:
        return ref[:5]  # the kernel's five outputs (the sixth is for the check)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        offsets, ps1, ps2, in_perm, out_perm = (x.cpu() for x in out)
        r_off, r_ps1, r_ps2, r_in = ref[:4]
        exact = exact_check((offsets, ps1, ps2), (r_off, r_ps1, r_ps2), ("offsets", "ps1", "ps2"))
        if not exact.ok:
            return exact
        off = r_off.tolist()
        bad = check_segments(in_perm, r_in, [(off[e], off[e + 1]) for e in range(len(off) - 1)])
        if bad:
            return Check(
                False, len(bad) / (len(off) - 1), 0.0, f"{len(bad)} expert segments of input_permutation"
            )
        return _check_output_permutation(out_perm, in_perm, r_off, ref[5], case)

    def traffic(self, case: Case) -> Traffic:
        t, e, k = int(case.dims["T"]), int(case.dims["E"]), topk(case)
        return Traffic(4 * (3 * t * k + (e + 1) + 6 * e), 0)


def _check_output_permutation(
    out_perm: torch.Tensor, in_perm: torch.Tensor, offsets: torch.Tensor, flat_ids: torch.Tensor, case: Case
) -> Check:
    """output_permutation must send flat (t, j) to a row of expert topk_ids[t, j] that gathers token t."""
    k = topk(case)
    n = out_perm.numel()
    rows = out_perm.long()
    if not torch.equal(torch.sort(rows).values, torch.arange(n)):
        return Check(False, 1.0, 0.0, "output_permutation is not a permutation")
    off = offsets.long()
    outside = (rows < off[flat_ids]) | (rows >= off[flat_ids + 1])
    if bool(outside.any()):
        return Check(False, float(outside.float().mean()), 0.0, "output_permutation leaves its expert's rows")
    if not torch.equal(in_perm.long()[rows], torch.arange(n) // k):
        return Check(False, 1.0, 0.0, "input_permutation[output_permutation[i]] != i // topk")
    return Check(True, 0.0, 0.0, "offsets/problem sizes exact; permutations consistent")


def _bind_w4a8_data(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    ids = inputs["topk_ids"]
    t, k = ids.shape
    e, n, hk = int(case.dims["E"]), int(case.dims["I"]), int(case.dims["H"])
    offsets, ps1, ps2, a_map, c_map = _prepare_outputs(t, k, e, ids.device)

    def launch() -> tuple[torch.Tensor, ...]:
        fn(ids, offsets, ps1, ps2, a_map, c_map, e, n, hk)
        return offsets, ps1, ps2

    return launch


@register
class GetCutlassW4a8MoeMmData(Adapter):
    kernel = "get_cutlass_w4a8_moe_mm_data"
    role = "moe"
    ops = ("experts",)
    description = "W4A8 MoE bookkeeping: expert offsets and (N, M, K) problem sizes (permutations unused)"
    backends = [
        Backend(
            "sgl_kernel",
            torch_op("get_cutlass_w4a8_moe_mm_data"),
            None,
            "aot",
            _bind_w4a8_data,
            preload=("sgl_kernel",),
        )
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return {"topk_ids": routing(case, device, seed).topk_ids}

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        d = case.dims
        return prepare_reference(inputs["topk_ids"], int(d["E"]), int(d["I"]), int(d["H"]), swapped=True)[:3]

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        # sglang's cutlass_w4a8_moe notes a_map / c_map are not written by this kernel: not compared.
        return exact_check(tuple(out), tuple(ref), ("expert_offsets", "problem_sizes1", "problem_sizes2"))

    def traffic(self, case: Case) -> Traffic:
        t, e, k = int(case.dims["T"]), int(case.dims["E"]), topk(case)
        return Traffic(4 * (t * k + (e + 1) + 6 * e), 0)
