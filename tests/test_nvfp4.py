"""dskbench.adapters.common.nvfp4: the NVFP4/MXFP4 format, checked against hand-computed values (CPU)."""

from __future__ import annotations

import itertools

import pytest
import torch

from dskbench.adapters.common import nvfp4 as fp4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_every_e2m1_code_round_trips() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    values = fp4.decode_e2m1(codes)
    assert values.tolist() == E2M1 + [-v for v in E2M1]
    assert torch.equal(fp4.encode_e2m1(values), codes)  # -0.0 keeps its sign bit: code 8
    assert torch.signbit(values[8])


def test_encode_rounds_to_nearest_even_and_saturates() -> None:
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 0.74, 5.01, 7.0, 1e9, -0.1, -100.0])
    # ties go to the even code (0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0); beyond 6 saturates; tiny negatives -> -0
    assert fp4.encode_e2m1(x).tolist() == [0, 2, 2, 4, 4, 6, 6, 1, 1, 7, 7, 7, 8, 15]


def test_known_values_pack_to_known_bytes() -> None:
    values = torch.tensor([1.0, -0.5, 6.0, 0.0, 0.5, 6.0, -6.0, 3.0])
    packed = fp4.pack_e2m1(fp4.encode_e2m1(values))
    # (even element in the low nibble): 1.0=2,-0.5=9 -> 0x92; 6=7,0=0 -> 0x07; 0.5=1,6=7 -> 0x71; -6=15,3=5 -> 0x5F
    assert packed.tolist() == [0x92, 0x07, 0x71, 0x5F]
    assert torch.equal(fp4.decode_e2m1(fp4.unpack_e2m1(packed)), values)


def test_quantize_block_by_hand() -> None:
    # amax 3 with global scale 448: sf = e4m3(448 * 3/6) = 224, q = x * 1/(224/448) = 2x, deq = code*224/448
    x = torch.tensor(
        [[3.0, -1.5, 0.25, 0.75, 1.0, -3.0, 0.5, 0.0, 2.0, 1.5, -0.25, 0.125, 1.75, -2.5, 0.0, 0.0]]
    )
    packed, sf = fp4.quantize_nvfp4(x, 448.0)
    assert sf.dtype == torch.float8_e4m3fn and sf.float().tolist() == [[224.0]]
    codes = fp4.unpack_e2m1(packed)[0].tolist()
    assert codes == [
        7,
        13,
        1,
        3,
        4,
        15,
        2,
        0,
        6,
        5,
        9,
        0,
        6,
        14,
        0,
        0,
    ]  # 0.125*2=0.25 ties to 0; -5 ties to -4
    deq = fp4.dequantize_nvfp4(packed, sf, 448.0)[0]
    assert deq.tolist() == [
        3.0,
        -1.5,
        0.25,
        0.75,
        1.0,
        -3.0,
        0.5,
        0.0,
        2.0,
        1.5,
        -0.25,
        0.0,
        2.0,
        -2.0,
        0.0,
        0.0,
    ]


def test_block_scale_is_e4m3_of_global_times_amax_over_6() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    gs = fp4.global_scale_for(x.abs().max())
    _, sf = fp4.quantize_nvfp4(x, gs)
    amax = x.reshape(8, 4, 16).abs().amax(-1)
    assert torch.equal(sf.float(), (gs * amax * torch.tensor(1 / 6)).to(torch.float8_e4m3fn).float())
    assert sf.float().max() <= 448.0


def test_quantize_error_bounds_on_random_data() -> None:
    torch.manual_seed(1)
    x = (torch.randn(64, 512) * torch.rand(64, 1) * 3).to(torch.bfloat16)
    gs = fp4.global_scale_for(x.float().abs().max())
    packed, sf = fp4.quantize_nvfp4(x, gs)
    deq = fp4.dequantize_nvfp4(packed, sf, gs)
    xf = x.float()
    amax = xf.reshape(64, 32, 16).abs().amax(-1, keepdim=True)
    # half of the widest grid step (4 -> 6) is amax/6; e4m3 rounding of the scale adds at most 1/16
    bound = (amax / 6 * (1 + 1 / 16) + 1e-6).expand(64, 32, 16).reshape(64, 512)
    assert ((deq - xf).abs() <= bound).all()
    rel = ((deq - xf).norm() / xf.norm()).item()
    assert 0.03 < rel < 0.12  # NVFP4 on Gaussian data: ~9 % rms


def test_mxfp4_scales_are_powers_of_two_rounded_up() -> None:
    x = torch.zeros(1, 64)
    x[0, 0] = 6.0  # amax/6 = 1 -> exponent 0 -> byte 127
    x[0, 32] = 7.0  # 7/6 -> rounded up to 2 -> byte 128
    packed, sf = fp4.quantize_mxfp4(x)
    assert sf.tolist() == [[127, 128]]
    deq = fp4.dequantize_mxfp4(packed, sf)
    assert deq[0, 0] == 6.0 and deq[0, 32] == 8.0  # 7/2 = 3.5 ties to 4 -> 8
    torch.manual_seed(2)
    y = torch.randn(16, 256)
    p, s = fp4.quantize_mxfp4(y)
    d = fp4.dequantize_mxfp4(p, s)
    scale = torch.exp2(s.float() - 127).repeat_interleave(32, dim=1)
    assert ((d - y).abs() <= scale + 1e-6).all()  # no saturation; error <= half the top step


@pytest.mark.parametrize("rows,cols", [(1, 7), (129, 5), (300, 12), (128, 4)])
def test_swizzle_round_trip_on_any_shape(rows: int, cols: int) -> None:
    s = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    sw = fp4.swizzle_scales(s)
    assert sw.shape == fp4.swizzled_shape(rows, cols)
    assert torch.equal(fp4.unswizzle_scales(sw, rows, cols), s)
    assert torch.equal(fp4.unswizzle_scales(sw.flatten(), rows, cols), s)
    assert int((sw != 0).sum()) == rows * cols  # padding is zero
    e4 = s.view(torch.float8_e4m3fn)
    assert fp4.swizzle_scales(e4).dtype == torch.float8_e4m3fn


def test_swizzle_batched_round_trip() -> None:
    s = torch.randint(1, 255, (3, 130, 9), dtype=torch.uint8)
    sw = fp4.swizzle_scales(s)
    assert sw.shape == (3, 256, 12)
    for e in range(3):
        assert torch.equal(sw[e], fp4.swizzle_scales(s[e]))
    assert torch.equal(fp4.unswizzle_scales(sw, 130, 9), s)
    assert torch.equal(fp4.unswizzle_scales(sw.flatten(), 130, 9), s)  # block_scale_interleave's 1-D form


def test_swizzle_index_mapping_by_hand() -> None:
    # 128x4 tiles stored [32][4][4]: row r -> (r % 32) * 16 + ((r % 128) // 32) * 4, col c -> c % 4,
    # tile (r // 128, c // 4) -> 512 * (r // 128 * ceil(cols / 4) + c // 4). For cols = 12 (3 K tiles):
    expected = {(0, 0): 0, (0, 1): 1, (1, 0): 16, (32, 0): 4, (96, 3): 15, (31, 0): 496, (0, 4): 512,
                (33, 5): 533, (128, 0): 1536, (299, 11): 1536 * 2 + 1024 + 11 * 16 + 1 * 4 + 3}  # fmt: skip
    s = torch.zeros(300, 12, dtype=torch.uint8)
    for i, (r, c) in enumerate(expected):
        assert fp4.swizzled_offset(r, c, 12) == expected[(r, c)]
        s[r, c] = i + 1
    flat = fp4.swizzle_scales(s).flatten()
    for i, pos in enumerate(expected.values()):
        assert flat[pos] == i + 1


def test_fp4_gemm_matches_float64() -> None:
    torch.manual_seed(3)
    m, n, k = 3, 5, 64
    a_p = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8)
    b_p = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    a_s = fp4.to_e4m3(torch.rand(m, k // 16) * 400 + 8)
    b_s = fp4.to_e4m3(torch.rand(n, k // 16) * 400 + 8)
    alpha = torch.tensor(3.7e-6)
    out = fp4.fp4_gemm_reference(a_p, a_s, b_p, b_s, alpha)

    def value(packed: torch.Tensor, scales: torch.Tensor, r: int, j: int) -> float:
        byte = int(packed[r, j // 2])
        code = byte & 0xF if j % 2 == 0 else byte >> 4
        mag = E2M1[code & 7] * (-1 if code & 8 else 1)
        return mag * float(scales[r, j // 16].float())

    for r, c in itertools.product(range(m), range(n)):
        want = sum(value(a_p, a_s, r, j) * value(b_p, b_s, c, j) for j in range(k)) * float(alpha)
        assert abs(float(out[r, c]) - want) <= 1e-5 * max(abs(want), 1e-3)


def _naive_moe(x, ids, w, w13, w2, gs=None, rsf=1.0):
    """Token by token, slot by slot, in float64."""

    def deq(p, s, ws2):
        return fp4.dequantize_nvfp4(p, s, 1.0 / ws2).double()

    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        xt = x[t : t + 1].float()
        if gs is not None:
            xt = fp4.dequantize_nvfp4(*fp4.quantize_nvfp4(xt, gs[0]), gs[0])
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = xt.double() @ deq(w13[0][e], w13[1][e], w13[2][e]).T
            act = torch.nn.functional.silu(h[:, : h.shape[1] // 2]) * h[:, h.shape[1] // 2 :]
            if gs is not None:
                act = fp4.dequantize_nvfp4(*fp4.quantize_nvfp4(act.float(), gs[1]), gs[1]).double()
            out[t] += float(w[t, j]) * (act @ deq(w2[0][e], w2[1][e], w2[2][e]).T)[0]
    return out * rsf


def _moe_problem(seed: int, t: int, e: int, h: int = 64, i: int = 32, k: int = 3) -> tuple:
    """A small routed-expert problem: x, top-k ids and weights, and NVFP4 (w13, w2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=g)

    def weight(rows: int, cols: int) -> tuple[torch.Tensor, ...]:
        p = torch.randint(0, 256, (e, rows, cols // 2), dtype=torch.uint8, generator=g)
        s = fp4.to_e4m3(torch.rand(e, rows, cols // 16, generator=g) * 400 + 16)
        return p, s, torch.rand(e, generator=g) * 1e-4 + 1e-4

    return x, ids, w, weight(2 * i, h), weight(h, i)


@pytest.mark.parametrize("w4a4", [False, True])
def test_moe_reference_matches_naive_loop(w4a4: bool) -> None:
    x, ids, w, w13, w2 = _moe_problem(4, t=6, e=5)
    gs = (torch.tensor(600.0), torch.tensor(900.0)) if w4a4 else None
    got = fp4.moe_reference(x, ids, w, w13, w2, act_global_scales=gs, routed_scaling_factor=2.5)
    want = _naive_moe(x, ids, w, w13, w2, gs, rsf=2.5)
    assert got.dtype == torch.float32 and got.shape == (6, 64)
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_moe_references_in_one_pass_equal_one_call_per_numerics() -> None:
    x, ids, w, w13, w2 = _moe_problem(5, t=7, e=6)
    gs = (torch.tensor(600.0), torch.tensor(900.0))
    both = fp4.moe_references(x, ids, w, w13, w2, [gs, None], routed_scaling_factor=2.5)
    for got, scales in zip(both, (gs, None), strict=True):
        want = fp4.moe_reference(x, ids, w, w13, w2, act_global_scales=scales, routed_scaling_factor=2.5)
        assert torch.equal(got, want)


def test_packed_byte_decode_equals_unpack_then_decode() -> None:
    b = torch.arange(256, dtype=torch.uint8).view(16, 16)
    assert torch.equal(fp4.decode_packed_e2m1(b), fp4.decode_e2m1(fp4.unpack_e2m1(b)))


def test_nvfp4_bytes_is_9_16_per_element() -> None:
    assert fp4.nvfp4_bytes(16384 * 7168) == 66_060_288  # o_proj weight [7168, 16384]
    assert fp4.nvfp4_bytes(16) == 9
