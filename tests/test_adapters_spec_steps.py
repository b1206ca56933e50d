"""The per-step bookkeeping kernels of EAGLE/NextN speculative decoding on CPU: each reference against a
small example worked by hand, the input builders, the exact checks, traffic, and the binders against the
kernels' launches (a fake kernel records the grid and arguments)."""

from __future__ import annotations

import torch

from dskbench.adapters import get_adapter
from dskbench.adapters.speculative import fill_bonus_tokens as FB
from dskbench.shapes.cases import Case, default_shapes

SHAPES = default_shapes()


def _case(kernel: str, phase: str = "decode") -> Case:
    a = get_adapter(kernel)
    return SHAPES.cases(a.kernel, list(a.ops), a.role, phase, profile="cpu")[-1]


class FakeKernel:
    """Records `fn[grid](*args, **kw)` and runs `body(*args)` in its place."""

    def __init__(self, body=None):
        self.body, self.grid, self.args, self.kw = body, None, None, None

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.grid, self.args, self.kw = grid, args, kw
            if self.body is not None:
                self.body(*args)

        return run


# -- fill_bonus_tokens ----------------------------------------------------------------------------


def test_bonus_reference_by_hand():
    # three requests, rows of num_steps + 1 = 4 tokens; accepted 1, 4 and 2 (bonus included)
    tokens = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]], dtype=torch.int32)
    lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    out = FB.bonus_reference(tokens, lens)
    assert out.dtype == torch.int32 and out.tolist() == [10, 23, 31]


def test_bonus_case_inputs_check_and_launch():
    a = get_adapter("fill_bonus_tokens")
    c = _case(a.kernel)
    assert c.dims["num_steps"] == 3 and c.dims["V"] == 129280
    inp = a.make_inputs(c, "cpu", 2)
    b = c.point["B"]
    tokens, lens = inp["accept_tokens"], inp["accept_lens"]
    assert tokens.shape == (b, 4) and tokens.dtype == torch.int32 and lens.dtype == torch.int32
    assert int(lens.min()) >= 1 and int(lens.max()) <= 4
    ref = a.reference(inp, c)
    assert a.check(ref.clone(), ref, c).ok and not a.check(ref + 1, ref, c).ok
    assert a.traffic(c).bytes == 12 * b

    def kernel(tok, ln, out, stride):  # the Triton kernel's arithmetic on the flat buffer
        flat = tok.flatten()
        for pid in range(ln.shape[0]):
            out[pid] = flat[stride * pid + ln[pid] - 1]

    fake = FakeKernel(kernel)
    out = a.backends[0].bind(fake, inp, c)()
    assert fake.grid == (b,) and fake.args[3] == 4 and fake.args[0] is tokens and fake.args[1] is lens
    assert torch.equal(out, ref)
