"""grouped_gemm_reference's chunked weight decode against the per-expert loop it replaced: outputs must
be bit-identical, on one storage per expert (a GPU) and on the shared slab (the CPU)."""

from __future__ import annotations

import pytest
import torch

from dskbench.adapters.common import fp8
from dskbench.adapters.moe import reference
from dskbench.adapters.moe.inputs import ExpertWeights, unpack_int4
from dskbench.adapters.moe.reference import grouped_gemm_reference
from tests.test_adapters_moe import _tiny_weights


def _decode_one(w: ExpertWeights, e: int) -> torch.Tensor:
    """Expert e's fp32 weight decoded on its own (the per-expert decode grouped_gemm_reference had)."""
    we, se = w.w[e], (w.scale[e] if w.scale is not None else None)
    if w.fmt == "bf16":
        return we.float()
    if w.fmt == "fp8_block":
        return fp8.dequant_block(we, se)
    return unpack_int4(we).float() * se.float().repeat_interleave(128, dim=-1)


def _grouped_gemm_per_expert(a: torch.Tensor, offsets: torch.Tensor, w: ExpertWeights) -> torch.Tensor:
    """Oracle: grouped_gemm_reference one storage group at a time (decode, then its GEMM), in expert order."""
    out = torch.zeros(a.shape[0], w.n, dtype=torch.float32)
    off = offsets.tolist()
    groups: dict[tuple[int, int], list[int]] = {}
    for e in range(len(off) - 1):
        if off[e + 1] > off[e]:
            groups.setdefault(w.key(e), []).append(e)
    for experts in groups.values():
        we = _decode_one(w, experts[0]).t()
        lo, hi = off[experts[0]], off[experts[-1] + 1]
        if sum(off[e + 1] - off[e] for e in experts) == hi - lo:
            torch.mm(a[lo:hi], we, out=out[lo:hi])
        else:
            rows = torch.cat([torch.arange(off[e], off[e + 1]) for e in experts])
            out[rows] = a[rows] @ we
    return out


def _offsets(counts: list[int]) -> torch.Tensor:
    """expert_offsets (int32 [E+1], as the adapters store them) from per-expert row counts."""
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "w4a8"])
@pytest.mark.parametrize(
    ("chunk", "counts", "n"),
    [
        # 9 used experts: the 9th opens a second chunk; experts 0, 5 and 10 have no rows
        (8, [0, 3, 1, 2, 4, 0, 1, 5, 2, 1, 0, 3], 256),
        # chunks of 3 over 4 used experts: a chunk of one; the last expert is empty; N not a block multiple
        (3, [2, 0, 0, 4, 1, 3, 0], 136),
    ],
)
def test_grouped_gemm_reference_chunked_decode_is_bit_identical(
    monkeypatch: pytest.MonkeyPatch, fmt: str, chunk: int, counts: list[int], n: int
) -> None:
    """Decoding the experts' weights a chunk at a time changes no output bit against the per-expert loop,
    on a GPU's one storage per expert and on the CPU's shared slab."""
    monkeypatch.setattr(reference, "GROUPED_DEQUANT_CHUNK", chunk)
    own = _tiny_weights(fmt, e=len(counts), n=n)
    slab = ExpertWeights(
        fmt,
        own.w[:1].expand(own.w.shape),
        None if own.scale is None else own.scale[:1].expand(own.scale.shape),
    )
    off = _offsets(counts)
    a = torch.randn(int(off[-1]), 256, generator=torch.Generator().manual_seed(11))
    for w in (own, slab):
        got = grouped_gemm_reference(a, off, w)
        assert torch.equal(got, _grouped_gemm_per_expert(a, off, w))
    assert torch.equal(grouped_gemm_reference(a[:0], _offsets([0] * len(counts)), own), torch.zeros(0, n))


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block", "w4a8"])
def test_dequant_many_matches_each_expert_alone(fmt: str) -> None:
    """A chunk's decode gives each expert the bits of its own decode (the chunked reference relies on it)."""
    w = _tiny_weights(fmt, e=5)
    got = w.dequant_many(torch.tensor([4, 0, 2]))
    for j, e in enumerate([4, 0, 2]):
        assert torch.equal(got[j], _decode_one(w, e))
        assert torch.equal(got[j], w.dequant(e, {}))
