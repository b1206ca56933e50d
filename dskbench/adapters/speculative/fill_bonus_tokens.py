"""`fill_bonus_tokens`: each request's bonus token after every EAGLE/NextN verify.

SGLang 0.5.16's EAGLE v2 (overlap) worker, after the target model verifies the draft
(eagle_worker_common.py), gathers `accept_tokens = predict[accept_index]` ([B, num_steps + 1] int32, one
row per request) and calls `fill_bonus_tokens_func(accept_tokens, accept_lens, bonus_tokens,
accept_index.shape[1], B)`, which launches `fill_bonus_tokens[(B,)]`: request b's bonus token is the last
accepted one, `accept_tokens[b, accept_lens[b] - 1]` (accept_lens counts the bonus token, so it is 1 to
num_steps + 1). The reference gathers the same element with torch; outputs are compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dskbench.adapters import register
from dskbench.adapters.backends import Backend
from dskbench.adapters.base import Adapter, Check, Traffic
from dskbench.adapters.common.inputs import exact_check, generator, nbytes
from dskbench.shapes.cases import Case


def bonus_dims(case: Case) -> tuple[int, int]:
    """(requests, accept_tokens' row width = num_steps + 1 for topk 1)."""
    return int(case.dims["B"]), int(case.dims["num_steps"]) + 1


def bonus_reference(accept_tokens: torch.Tensor, accept_lens: torch.Tensor) -> torch.Tensor:
    """bonus[b] = accept_tokens[b, accept_lens[b] - 1] (int32 [B])."""
    last = (accept_lens.long() - 1).unsqueeze(1)
    return accept_tokens.gather(1, last).squeeze(1).to(torch.int32)


def _bind(fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
    tokens, lens = inputs["accept_tokens"], inputs["accept_lens"]
    b, stride = tokens.shape
    out = torch.empty_like(lens, dtype=torch.int32)

    def launch() -> torch.Tensor:
        fn[(b,)](tokens, lens, out, stride)
        return out

    return launch


@register
class FillBonusTokensAdapter(Adapter):
    kernel = "fill_bonus_tokens"
    role = "spec"
    ops = ("eagle.fill_bonus_tokens",)
    description = "EAGLE/NextN verify: each request's bonus token (the last accepted one)"
    backends = [
        Backend(
            "triton",
            "sglang.kernels.ops.speculative.eagle:fill_bonus_tokens",
            "sglang",
            "triton",
            _bind,
            label="what SGLang 0.5.16 runs after every verify",
            note="fill_bonus_tokens_func's launch: one program per request",
        ),
    ]

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        b, stride = bonus_dims(case)
        gen = generator(seed)
        tokens = torch.randint(0, int(case.dims["V"]), (b, stride), generator=gen, dtype=torch.int32)
        lens = torch.randint(1, stride + 1, (b,), generator=gen, dtype=torch.int32)
        return {"accept_tokens": tokens.to(device), "accept_lens": lens.to(device)}

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        return bonus_reference(inputs["accept_tokens"], inputs["accept_lens"])

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        return exact_check((out,), (ref,), ("bonus_tokens",))

    def traffic(self, case: Case) -> Traffic:
        b, _ = bonus_dims(case)
        return Traffic(
            bytes=nbytes(3 * b, torch.int32),
            flops=0,
            note="read accept_lens and one accepted token per request; write one int32 per request",
        )
