"""`build_tree_kernel_efficient`: the EAGLE draft tree's FULL_MASK tree mask, positions
and retrieve links.

SGLang 0.5.16 on sm90: `eagle_utils.build_tree_kernel_efficient` -> sgl-kernel AOT
`build_tree_kernel_efficient` with FULL_MASK (labelled); the Triton twin
`spec_tree.sgl_build_tree_kernel_efficient_triton` is the XPU path. The reference is compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import SGLANG_SM90, exact_check, generator
from dskbench.adapters.speculative.tree import (
    FULL_MASK,
    SEQ_LENS,
    SpecDims,
    build_tree_ref,
    simulate_draft,
    spec_dims,
)
from dskbench.shapes.cases import Case


def _tree_outputs(inputs: dict[str, Any], sd: SpecDims) -> tuple[torch.Tensor, ...]:
    dev = inputs["seq_lens"].device
    mask = torch.ones(inputs["mask_numel"], dtype=torch.bool, device=dev)
    positions = torch.empty(sd.b * sd.draft, dtype=torch.int64, device=dev)
    links = torch.full((3, sd.b, sd.draft), -1, dtype=torch.int64, device=dev)
    return mask, positions, links[0], links[1], links[2]


def _bind_build_aot(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    """Outputs are initialised once here (SGLang re-fills them per call); later launches find the links
    already set, do the same work, and leave self-referencing sibling links: the first launch is checked."""
    sd = spec_dims(case)
    outs = _tree_outputs(inputs, sd)
    pl, si, sl = inputs["parent_list"], inputs["selected_index"], inputs["seq_lens"]

    def launch() -> tuple[torch.Tensor, ...]:
        fn(pl, si, sl, *outs, sd.topk, sd.steps, sd.draft, FULL_MASK)
        return outs

    return launch


def _bind_build_triton(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    sd = spec_dims(case)
    outs = _tree_outputs(inputs, sd)
    pl, si, sl = inputs["parent_list"], inputs["selected_index"], inputs["seq_lens"]
    prefix = torch.cumsum(sl, dim=0) - sl

    def launch() -> tuple[torch.Tensor, ...]:
        fn[(sd.b,)](
            pl,
            si,
            sl,
            prefix,
            *outs,
            topk=sd.topk,
            depth=sd.steps,
            draft_token_num=sd.draft,
            tree_mask_mode=FULL_MASK,
            batch_size=sd.b,
            parent_list_stride=pl.stride(0),
            selected_index_stride=si.stride(0),
        )
        return outs

    return launch


def _tree_inputs(case: Case, gen: torch.Generator, device: str) -> dict[str, Any]:
    sd = spec_dims(case)
    parent_list, selected = simulate_draft(sd, gen)
    seq_lens = torch.randint(SEQ_LENS[0], SEQ_LENS[1], (sd.b,), generator=gen, dtype=torch.int64)
    return {
        "parent_list": parent_list.to(device),
        "selected_index": selected.to(device),
        "seq_lens": seq_lens.to(device),
        "mask_numel": int(seq_lens.sum()) * sd.draft + sd.b * sd.draft * sd.draft,
    }


@register
class BuildTreeAdapter(Adapter):
    kernel = "build_tree_kernel_efficient"
    role = "spec"
    ops = ("eagle_worker.forward",)
    description = "EAGLE draft tree: FULL_MASK tree mask, positions and retrieve links"
    backends = [
        Backend(
            "sgl_kernel",
            "torch.ops.sgl_kernel.build_tree_kernel_efficient.default",
            None,
            "aot",
            _bind_build_aot,
            preload=("sgl_kernel",),
            label=SGLANG_SM90,
        ),
        Backend(
            "sglang_triton",
            "sglang.kernels.ops.speculative.spec_tree:sgl_build_tree_kernel_efficient_triton",
            None,
            "triton",
            _bind_build_triton,
            note="SGLang's XPU path",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        return _tree_inputs(case, generator(seed), device)

    def reference(self, inputs: dict[str, Any], case: Case) -> tuple[torch.Tensor, ...]:
        sd = spec_dims(case)
        return build_tree_ref(
            inputs["parent_list"], inputs["selected_index"], inputs["seq_lens"], sd.topk, sd.draft
        )

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check(
            tuple(out), tuple(ref), ("tree_mask", "positions", "index", "next_token", "next_sibling")
        )

    def traffic(self, case: Case) -> Traffic:
        sd = spec_dims(case)
        b, d = sd.b, sd.draft
        read = 8 * (b * sd.parent_width + b * (d - 1) + b)
        written = b * d * d + 8 * b * d * 4  # draft block of the mask (prefix is not written) + int64 outputs
        return Traffic(bytes=read + written, note="tree-mask prefix columns are left as initialised")
