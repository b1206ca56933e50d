"""Non-kernel traced names (dskbench.adapters.misc.weak_ref, the host-side workspace sizing beside
dskbench.adapters.attention.mla_decode_cutlass): no adapters, and the GPU-test helpers."""

from __future__ import annotations

import pytest
import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.attention import mla_decode_cutlass as W
from dskbench.adapters.backends import Unavailable
from dskbench.adapters.misc import weak_ref as M


def test_host_functions_have_no_adapter():
    # registry statuses `utility` and `host-only`: nothing to time on the device
    assert get_adapter("weak_ref_tensor") is None
    assert get_adapter("cutlass_mla_get_workspace_size") is None


def test_workspace_size_helper_passes_deepseek_arguments():
    seen = []

    def fake(max_seq_len, num_batches, sm_count=0, num_kv_splits=1):
        seen.append((max_seq_len, num_batches, sm_count, num_kv_splits))
        return 1 << 20

    assert W.cutlass_mla_workspace_size(fn=fake) == 1 << 20
    assert seen == [(163840, 64, 0, 1)]


@pytest.mark.parametrize("bad", [0, -4, 12.0, True, None])
def test_workspace_size_helper_rejects_non_positive_or_non_int(bad):
    with pytest.raises(ValueError, match="positive int"):
        W.cutlass_mla_workspace_size(fn=lambda *args: bad)


def test_weak_ref_helper_demands_an_alias():
    t = torch.arange(12.0).view(3, 4)
    assert M.check_weak_ref(t, fn=lambda x: x.view(x.shape)).data_ptr() == t.data_ptr()
    for wrong in (lambda x: x.clone(), lambda x: x.view(4, 3), lambda x: x.to(torch.float64)):
        with pytest.raises(ValueError, match="did not alias"):
            M.check_weak_ref(t, fn=wrong)


def test_helpers_name_the_sgl_kernel_functions():
    # resolution needs sgl_kernel (GPU box); on this machine it must fail cleanly, not crash
    try:
        import sgl_kernel  # noqa: F401
    except ImportError:
        with pytest.raises(Unavailable):
            W.cutlass_mla_workspace_size()
    assert W.WORKSPACE_TARGET == "sgl_kernel.attention:cutlass_mla_get_workspace_size"
    assert M.WEAK_REF_TARGET == "sgl_kernel.memory:weak_ref_tensor"


def test_exact_check_compares_in_place_across_integer_dtypes():
    import torch

    from dskbench.adapters.common.inputs import exact_check

    ref = torch.arange(12, dtype=torch.int64).view(3, 4)
    assert exact_check((ref.to(torch.int32),), (ref,), ("ids",)).ok  # same values, other dtype
    out = ref.to(torch.uint8).clone()
    out[1, 2] = 99
    chk = exact_check((out,), (ref.to(torch.uint8),), ("rows",))
    assert not chk.ok and chk.error == 1 / 12 and chk.detail == "rows:1 differ"
    bad = exact_check((ref[:2],), (ref,), ("ids",))
    assert not bad.ok and bad.detail == "ids: shape (2, 4) != (3, 4)"


def test_randn_draws_a_large_tensor_in_chunks_and_a_small_one_as_before(monkeypatch):
    import torch

    from dskbench.adapters.common import inputs

    small = inputs.randn((4, 8), inputs.generator(3), "cpu", scale=0.5)
    g = inputs.device_generator(inputs.generator(3), "cpu")
    assert torch.equal(small, (torch.randn((4, 8), generator=g) * 0.5).to(torch.bfloat16))  # unchanged
    monkeypatch.setattr(inputs, "DRAW_CHUNK", 1000)
    big = inputs.randn((64, 100), inputs.generator(3), "cpu", scale=2.0)  # 7 chunks, the last one short
    assert big.shape == (64, 100) and big.dtype == torch.bfloat16
    assert bool((big[-1] != 0).any()) and abs(float(big.float().std()) - 2.0) < 0.1
    again = inputs.randn((64, 100), inputs.generator(3), "cpu", scale=2.0)
    assert torch.equal(big, again)  # one seed, one tensor


def test_randint_draws_on_the_device_generator_and_is_seeded(monkeypatch):
    """Large integer tables (a request pool's token table) are drawn where they live: on the generator
    device_generator seeds for the target device, never on the host's generator."""
    import torch

    from dskbench.adapters.common import inputs

    x = inputs.randint(1, 1 << 22, (9, 1000), inputs.generator(3), "cpu")
    assert x.dtype == torch.int32 and int(x.min()) >= 1 and int(x.max()) < 1 << 22
    assert torch.equal(x, inputs.randint(1, 1 << 22, (9, 1000), inputs.generator(3), "cpu"))
    b = inputs.randint(0, 256, (4, 64), inputs.generator(3), "cpu", torch.uint8)
    assert b.dtype == torch.uint8 and len(torch.unique(b)) > 100
    asked: list[str] = []
    real = inputs.device_generator
    monkeypatch.setattr(inputs, "device_generator", lambda g, d: asked.append(d) or real(g, d))
    inputs.randint(0, 2, (2,), inputs.generator(3), "cpu")
    assert asked == ["cpu"]


def test_normal_draws_in_the_target_dtype_and_is_seeded():
    import torch

    from dskbench.adapters.common import inputs

    x = inputs.normal((256, 100), inputs.generator(3), "cpu", scale=2.0)
    assert x.shape == (256, 100) and x.dtype == torch.bfloat16
    assert abs(float(x.float().std()) - 2.0) < 0.05 and abs(float(x.float().mean())) < 0.05
    assert torch.equal(x, inputs.normal((256, 100), inputs.generator(3), "cpu", scale=2.0))
    assert not torch.equal(x, inputs.normal((256, 100), inputs.generator(4), "cpu", scale=2.0))
    assert inputs.normal((4,), inputs.generator(3), "cpu", torch.float32).dtype == torch.float32
