"""DeepSeek-V3.2's FP8 KV gather for its FP8 sparse prefill over a cached prefix
(dskbench.adapters.nsa.kv_gather_fp8) on CPU: the reference against a small slot worked by hand, the
one-e4m3-step check, the input builder, traffic, and the binder against a stand-in of the launcher and of
the kernel's address arithmetic."""

from __future__ import annotations

import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.nsa import kv_gather_fp8 as K
from dskbench.shapes.cases import default_shapes

SHAPES = default_shapes()
KERNEL = "_gather_dequant_requant_fp8_paged_kernel"


def _cases():
    a = get_adapter(KERNEL)
    return SHAPES.cases(a.kernel, list(a.ops), a.role, "prefill", profile="cpu")


def _slot(latent: list[int], scales: list[float], rope: list[float]) -> torch.Tensor:
    return torch.cat(
        [
            torch.tensor(latent, dtype=torch.uint8),
            torch.tensor(scales, dtype=torch.float32).view(torch.uint8),
            torch.tensor(rope, dtype=torch.bfloat16).view(torch.uint8),
        ]
    )


def test_reference_by_hand():
    # a latent of 2 tiles of 128 and a rope of 2: 256 + 8 + 4 = 268 bytes a slot
    assert K.slot_bytes(256, 2) == 268 and K.slot_bytes(512, 64) == 656
    cache = torch.zeros((3, 268), dtype=torch.uint8)
    # slot 2: tile 0 all 1.0 (0x38) with scale 0.5, tile 1 alternately 1.0 and 3.0 (0x44) with scale 1.0625
    cache[2] = _slot([0x38] * 128 + [0x38, 0x44] * 64, [0.5, 1.0625], [1.5, -2.0])
    cache[1] = _slot([0x40] * 256, [1.0, 1.0], [7.0, 0.0])  # not listed: not read
    out = K.gather_dequant_requant_reference(cache.view(K.FP8).unsqueeze(1), torch.tensor([2, 0]), 256, 2, 1)
    assert out.shape == (3, 1, 258) and out.dtype == K.FP8
    b = out.view(torch.uint8).view(3, 258)
    assert b[0, :128].tolist() == [0x30] * 128  # 1.0 * 0.5 = 0.5
    # 1.0 * 1.0625 ties between 1.0 and 1.125: to even, 1.0; 3.0 * 1.0625 = 3.1875 -> 3.25 (0x45)
    assert b[0, 128:256].tolist() == [0x38, 0x45] * 64
    assert b[0, 256:].tolist() == [0x3C, 0xC0]  # rope 1.5, -2.0 cast to e4m3
    assert not b[1:].any()  # slot 0 is zero; the pad row is zero


def test_the_check_takes_one_e4m3_step_and_nothing_more():
    ref = torch.tensor([[0x38, 0x45, 0x00], [0x00, 0x00, 0x00]], dtype=torch.uint8).view(K.FP8).unsqueeze(1)

    def with_(i: int, j: int, byte: int) -> torch.Tensor:
        o = ref.clone().view(torch.uint8)
        o[i, 0, j] = byte
        return o.view(K.FP8)

    assert K.fp8_step_check(ref.clone(), ref, 1).ok
    c = K.fp8_step_check(with_(0, 1, 0x44), ref, 1)
    assert c.ok and c.error == 1 / 6
    assert K.fp8_step_check(with_(0, 2, 0x80), ref, 1).ok  # -0 for +0
    assert not K.fp8_step_check(with_(0, 1, 0x43), ref, 1).ok  # two steps
    assert not K.fp8_step_check(with_(0, 0, 0xB8), ref, 1).ok  # the sign
    assert not K.fp8_step_check(with_(0, 1, 0x7F), ref, 1).ok  # NaN
    assert not K.fp8_step_check(with_(1, 0, 0x01), ref, 1).ok  # a pad row not zero
    assert not K.fp8_step_check(ref[:1], ref, 1).ok


def _launcher_stand_in(quant_k_cache, page_table_1_flattened, group_size=128, extra_rows=0):
    """gather_dequant_requant_fp8_paged's views and launch, the kernel's programs run one by one on the
    flat storage with its strides and offsets."""
    qk = quant_k_cache.view(-1, 656)
    n = page_table_1_flattened.shape[0]
    output = torch.zeros((n + extra_rows, 1, 576), dtype=K.FP8)
    flat = qk.view(torch.uint8).reshape(-1)
    nope_q = flat.view(K.FP8)  # the 512 latent bytes at offset 0, row stride 656
    nope_s = flat[512:][: (flat.numel() - 512) // 4 * 4].view(torch.float32)  # row stride 656 / 4
    rope = flat[528:][: (flat.numel() - 528) // 2 * 2].view(torch.bfloat16)  # row stride 656 / 2
    out = output.view(-1)
    for token_id in range(n):
        paged = int(page_table_1_flattened[token_id])
        for block in range(5):
            if block < 4:
                offs = block * group_size + torch.arange(group_size)
                y = nope_q[paged * 656 + offs].float() * nope_s[paged * 164 + block]
                out[token_id * 576 + offs] = y.to(K.FP8)
            else:
                offs = torch.arange(64)
                out[token_id * 576 + 512 + offs] = rope[paged * 328 + offs].to(K.FP8)
    return output


def test_cases_inputs_check_traffic_and_launch():
    a = get_adapter(KERNEL)
    cases = _cases()
    assert [c.variant for c in cases] == ["prefix_4k", "prefix_32k"]
    assert all(a.applies(c) for c in cases)
    c = cases[0]
    n, lkv, dr, pad, pool = K.gather_dims(c)
    assert (n, lkv, dr, pad) == (2 * 4096 + c.point["T"], 512, 64, 2048) and pool >= 2 * n
    inp = a.make_inputs(c, "cpu", 3)
    cache, slots = inp["kv_cache"], inp["page_table_1_flattened"]
    assert cache.shape == (pool, 1, 656) and cache.dtype == K.FP8
    assert slots.dtype == torch.int32 and slots.shape == (n,) and len(set(slots.tolist())) == n
    assert int(slots.min()) >= 1 and int(slots.max()) < pool
    rows = cache.view(torch.uint8)[slots.long(), 0]
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    assert bool((scales > 0).all()) and not bool(torch.isnan(rows[:, :512].view(K.FP8).float()).any())
    ref = a.reference(inp, c)
    assert ref.shape == (n + pad, 1, 576) and ref.dtype == K.FP8
    assert a.check(ref.clone(), ref, c).ok
    bad = ref.clone().view(torch.uint8)
    bad[n - 1, 0, 7] ^= 0x0F
    assert not a.check(bad.view(K.FP8), ref, c).ok
    assert a.traffic(c).bytes == n * 656 + 4 * n + (n + pad) * 576

    # the binder's call, on the first 48 listed slots, through the stand-in of the launcher and kernel
    few = {"kv_cache": cache, "page_table_1_flattened": slots[:48]}
    out = a.backends[0].bind(_launcher_stand_in, few, c)()
    assert out.shape == (48 + pad, 1, 576)
    assert torch.equal(out.view(torch.uint8), a.reference(few, c).view(torch.uint8))
