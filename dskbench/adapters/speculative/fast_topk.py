"""`fast_topk`: top-k of the draft distribution [B*topk, V].

What SGLang 0.5.16 runs for the draft top-k: for topk == 1 on CUDA, `eagle_worker_v2.draft_forward` calls
the Triton `sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess` (backend "sglang_triton.topk1",
labelled), not `fast_topk`. `sgl_kernel.fast_topk` (what the trace names) is plain PyTorch — `torch.max`
for topk 1, `torch.topk` otherwise — with no custom kernel (backend "sgl_kernel", kind torch); SGLang calls
it in the decode draft loop for topk > 1 and, for any topk, once after a prefill
(`_draft_extend_for_prefill`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import TOLERANCES, Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.inputs import SGLANG_SM90, generator
from dskbench.adapters.sampling.filters import make_probs
from dskbench.adapters.speculative.tree import SEQ_LENS, spec_dims
from dskbench.shapes.cases import Case


def _bind_fast_topk(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    probs, k = inputs["probs"], spec_dims(case).topk
    return lambda: tuple(fn(probs, k, -1))


def _bind_topk1(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    # draft_topk1_postprocess(next_token_logits, positions) -> (topk_p = 1.0, topk_index); it also
    # advances positions by one per call. topk_p is constant by design: only the indices are checked.
    if spec_dims(case).topk != 1:
        raise ValueError("draft_topk1_postprocess is SGLang's topk == 1 path only")
    probs, positions = inputs["probs"], inputs["positions"]
    return lambda: fn(probs, positions)[1]


@register
class FastTopkAdapter(Adapter):
    kernel = "fast_topk"
    role = "spec"
    ops = ("eagle_worker.forward",)
    description = "top-k of the draft distribution [B*topk, V] (torch.max for topk 1)"
    backends = [
        Backend(
            "sgl_kernel",
            "sgl_kernel.top_k:fast_topk",
            None,
            "torch",
            _bind_fast_topk,
            dispatches_to="torch.max (topk == 1) / torch.topk",
            label="plain PyTorch (torch.max / torch.topk): sgl-kernel has no custom kernel for it",
            note="pure PyTorch in sgl-kernel: no custom kernel",
        ),
        Backend(
            "sglang_triton.topk1",
            "sglang.kernels.ops.speculative.topk1:draft_topk1_postprocess",
            None,
            "triton",
            _bind_topk1,
            label=SGLANG_SM90,
            note="split-vocab argmax SGLang uses instead of fast_topk when topk == 1",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        sd = spec_dims(case)
        rows = sd.b * sd.topk
        gen = generator(seed)
        return {
            "probs": make_probs(rows, sd.v, gen, device),
            "positions": torch.randint(SEQ_LENS[0], SEQ_LENS[1], (rows,), generator=gen).to(device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(inputs["probs"].float(), spec_dims(case).topk, dim=-1)
        return values, indices

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        values, indices = (None, out) if isinstance(out, torch.Tensor) else (out[0], out[1])
        ref_values, ref_indices = ref
        if tuple(indices.shape) != tuple(ref_indices.shape):
            return Check(False, float("inf"), 0.0, f"indices shape {tuple(indices.shape)}")
        same = torch.equal(indices.cpu().long().sort(-1).values, ref_indices.cpu().long().sort(-1).values)
        tol = TOLERANCES["float32"]
        err = 0.0 if values is None else rel_error(values, ref_values)
        detail = ("indices match" if same else "indices differ") + (
            " (values not returned)" if values is None else ""
        )
        return Check(same and err <= tol, err, tol, detail)

    def traffic(self, case: Case) -> Traffic:
        sd = spec_dims(case)
        rows = sd.b * sd.topk
        return Traffic(
            bytes=4 * rows * sd.v + 12 * rows * sd.topk, note="read probs, write values + int64 ids"
        )
