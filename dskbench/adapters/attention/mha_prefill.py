"""MHA prefill (the non-absorbed prefill path): the inputs, reference and traffic its kernels share.

q/k [T, Nh, 192], v [T, Nh, 128], causal, no prefix; a prefill step's T tokens are split into requests of
at most ``PREFILL_SEQ_LEN`` tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from dskbench.adapters.attention.mla import case_softmax_scale
from dskbench.adapters.base import Adapter, Traffic
from dskbench.adapters.common.inputs import generator, randn
from dskbench.adapters.common.matmul_precision import exact_in_tf32, fp32_matmul, matmul_split_tf32
from dskbench.shapes.cases import Case

PREFILL_SEQ_LEN = 4096  # longest request in a prefill step


def prefill_seq_lens(num_tokens: int) -> list[int]:
    """Requests of a prefill step: PREFILL_SEQ_LEN-token prompts, the remainder as one shorter prompt."""
    full, rest = divmod(num_tokens, PREFILL_SEQ_LEN)
    return [PREFILL_SEQ_LEN] * full + ([rest] if rest else [])


def mha_causal_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float
) -> torch.Tensor:
    """Causal attention per request in fp32 (heads in chunks to bound the score matrix) -> [T, Nh, Dv].
    BF16 q, k and v are exact in TF32: q . k^T then runs on TF32 tensor cores with exact products, and the
    fp32 probabilities times v as two such matmuls (matmul_split_tf32); other types in IEEE fp32."""
    t, nh, _ = q.shape
    out = torch.empty(t, nh, v.shape[-1], dtype=torch.float32, device=q.device)
    start, tf32 = 0, exact_in_tf32(q, k, v)
    for s in seq_lens:
        sl = slice(start, start + s)
        hc = max(1, min(nh, (1 << 26) // (s * s)))
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        for h0 in range(0, nh, hc):
            hs = slice(h0, min(nh, h0 + hc))
            qh, kh, vh = (x[sl, hs].float().transpose(0, 1) for x in (q, k, v))
            with fp32_matmul(tf32):
                scores = (qh @ kh.transpose(1, 2)) * scale
            p = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            out[sl, hs] = (matmul_split_tf32(p, vh) if tf32 else p @ vh).transpose(0, 1)
        start += s
    return out


class MhaPrefill(Adapter):
    """Shared inputs, reference and traffic of the MHA prefill kernels (role mha_prefill of attn_mha)."""

    role = "mha_prefill"
    ops = ("attn_mha",)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        d = case.dims
        t, nh, dq, dv = int(d["T"]), int(d["Nh"]), int(d["Dq"]), int(d["Dv"])
        gen = generator(seed)
        return {
            "q": randn((t, nh, dq), gen, device),
            "k": randn((t, nh, dq), gen, device),
            "v": randn((t, nh, dv), gen, device),
        }

    def reference(self, inputs: dict[str, Any], case: Case) -> torch.Tensor:
        lens = prefill_seq_lens(int(case.dims["T"]))
        return mha_causal_reference(inputs["q"], inputs["k"], inputs["v"], lens, case_softmax_scale(case))

    def traffic(self, case: Case) -> Traffic:
        d = case.dims
        t, nh, dq, dv = int(d["T"]), int(d["Nh"]), int(d["Dq"]), int(d["Dv"])
        pairs = sum(s * (s + 1) // 2 for s in prefill_seq_lens(t))
        return Traffic(
            t * nh * (2 * dq + 2 * dv) * 2,
            2 * nh * (dq + dv) * pairs,
            f"causal, no prefix; requests of {PREFILL_SEQ_LEN} tokens",
        )


def ragged_meta(case: Case, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    """(cu_seqlens int64 [R+1], request lengths) of `case`'s prefill step."""
    lens = prefill_seq_lens(int(case.dims["T"]))
    cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return cu.to(device), lens
