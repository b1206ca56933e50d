"""dskbench.adapters.common.fp8: quantisation granularities, scale layouts and their inverses (CPU)."""

from __future__ import annotations

import pytest
import torch

from dskbench.adapters.common import fp8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_per_token_fp8_hand_checked():
    # amax 4 -> scale 4/448; x/scale = 112, -224, 448, 56, all exact in e4m3, so dequant is exact.
    x = torch.tensor([[1.0, -2.0, 4.0, 0.5]])
    q, s = fp8.per_token_quant(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (1, 1)
    assert s.item() == pytest.approx(4.0 / 448.0)
    assert q.float().tolist() == [[112.0, -224.0, 448.0, 56.0]]
    assert torch.equal(fp8.dequant(q, s), x)


def test_per_token_int8_rounds_and_saturates():
    x = torch.tensor([[127.0, -63.4, 0.6, -127.0]])
    q, s = fp8.per_token_quant(x, torch.int8)
    assert q.dtype == torch.int8 and s.item() == pytest.approx(1.0)
    assert q.tolist() == [[127, -63, 1, -127]]


@pytest.mark.parametrize("dtype,err", [(torch.float8_e4m3fn, 0.04), (torch.int8, 0.01)])
def test_per_token_roundtrip_and_row_amax(dtype, err):
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    q, s = fp8.per_token_quant(x, dtype)
    assert s.shape == (8, 1)
    assert torch.equal(q.float().abs().amax(dim=-1), torch.full((8,), fp8.qmax(dtype)))
    assert _rel(fp8.dequant(q, s), x) < err


def test_per_tensor():
    x = torch.randn(4, 3, 64, generator=torch.Generator().manual_seed(1))
    q, s = fp8.per_tensor_quant(x)
    assert s.shape == (1,) and q.shape == x.shape
    assert s.item() == pytest.approx(x.abs().max().item() / 448.0)
    assert _rel(fp8.dequant(q, s), x) < 0.04


def test_per_token_group_scales_each_group():
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2))
    x[1, 128:256] *= 100.0  # one loud group must not coarsen its neighbours
    q, s = fp8.per_token_group_quant(x)
    assert q.shape == x.shape and s.shape == (3, 4) and s.is_contiguous()
    want = x.view(3, 4, 128).abs().amax(dim=-1) / 448.0
    assert torch.allclose(s, want)
    assert _rel(fp8.dequant_per_token_group(q, s)[1, :128], x[1, :128]) < 0.04
    with pytest.raises(ValueError):
        fp8.per_token_group_quant(torch.randn(2, 100))


def test_per_token_group_ue8m0_rounds_scales_up_to_powers_of_two():
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(3))
    _, raw = fp8.per_token_group_quant(x)
    q, s = fp8.per_token_group_quant(x, ue8m0=True)
    assert torch.all(s >= raw) and torch.all(s < 2 * raw)
    assert torch.equal(torch.log2(s), torch.round(torch.log2(s)))
    assert _rel(fp8.dequant_per_token_group(q, s), x) < 0.06


def test_block_quant_partial_block_and_batch():
    # N = 200 = 128 + 72: the partial block gets its own scale, as DeepSeek's N = 2112 projection.
    w = torch.randn(2, 200, 384, generator=torch.Generator().manual_seed(4)) * 0.02
    w[1, 150, 10] = 5.0  # an outlier only affects its own block
    q, s = fp8.block_quant(w)
    assert q.shape == w.shape and s.shape == (2, 2, 3)
    assert s[1, 1, 0].item() == pytest.approx(5.0 / 448.0)
    assert s[1, 0, 0].item() == pytest.approx(w[1, :128, :128].abs().max().item() / 448.0)
    assert q[1, 150, 10].float().item() == 448.0
    deq = fp8.dequant_block(q, s)
    assert _rel(deq[0], w[0]) < 0.04
    assert torch.equal(fp8.expand_block_scale(s, (128, 128), 200, 384)[1, 199, 383], s[1, 1, 2])


def test_dequant_block_whole_blocks_equal_the_expanded_scales():
    """Whole blocks multiply through a broadcast view: the same products as one scale per element,
    with leading batch dims and with an expert slab broadcast over E (stride 0)."""
    w = torch.randn(3, 256, 384, generator=torch.Generator().manual_seed(6))
    q, s = fp8.block_quant(w)
    want = q.float() * fp8.expand_block_scale(s, (128, 128), 256, 384)
    assert torch.equal(fp8.dequant_block(q, s), want)
    assert torch.equal(fp8.dequant_block(q[1], s[1]), want[1])
    slab_q, slab_s = q[:1].expand(4, 256, 384), s[:1].expand(4, 2, 3)
    assert torch.equal(fp8.dequant_block(slab_q, slab_s)[3], want[0])


def test_scale_layouts_keep_values():
    s = torch.arange(5 * 3, dtype=torch.float32).view(5, 3)
    row, col, tma = (fp8.scale_layout(s, lay) for lay in ("row", "col", "col_tma"))
    for t in (row, col, tma):
        assert t.shape == (5, 3) and torch.equal(t, s)
    assert row.stride() == (3, 1)
    assert col.stride() == (1, 5)
    assert tma.stride() == (1, 8)  # M padded to a multiple of 4
    with pytest.raises(ValueError):
        fp8.scale_layout(s, "diagonal")


def test_quantize_rejects_other_dtypes():
    with pytest.raises(ValueError):
        fp8.quantize(torch.ones(2), torch.ones(1), torch.float16)
