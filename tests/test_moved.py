"""A module that a later release moved: resolve finds the backend's kernel at the new place and records
that target; the table covers every module the adapters name under the moved prefix."""

from __future__ import annotations

import sys

import pytest

from dskbench.adapters import adapters, get_adapter, moved
from dskbench.adapters.backends import Backend, Unavailable, candidates, resolve


def _backend(target: str, fallbacks: tuple[str, ...] = ()) -> Backend:
    return Backend("b", target, None, "jit", lambda fn, inputs, case: fn, fallbacks=fallbacks)


def test_resolve_tries_the_moved_module_after_the_named_ones(tmp_path, monkeypatch):
    pkg = tmp_path / "dskb_moved_new"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "norm.py").write_text("def rmsnorm(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(moved, "MOVED", {"dskb_moved_old.norm": "dskb_moved_new.norm"})
    b = _backend("dskb_moved_old.norm:rmsnorm", fallbacks=("dskb_moved_other:rmsnorm",))
    assert candidates(b) == [
        "dskb_moved_old.norm:rmsnorm",
        "dskb_moved_other:rmsnorm",
        "dskb_moved_new.norm:rmsnorm",
    ]
    r = resolve(b)
    assert r.target == "dskb_moved_new.norm:rmsnorm" and r.fn(3) == 3
    sys.modules.pop("dskb_moved_new.norm", None)
    sys.modules.pop("dskb_moved_new", None)
    monkeypatch.setattr(moved, "MOVED", {})
    with pytest.raises(Unavailable, match="not available in this install: dskb_moved_old.norm:rmsnorm: "):
        resolve(_backend("dskb_moved_old.norm:rmsnorm"))


def test_every_moved_module_is_one_an_adapter_names_and_every_sglang_jit_module_has_its_new_place():
    named = {
        t.split(":", 1)[0]
        for name in adapters()
        for b in get_adapter(name).all_backends()
        for t in (b.target, *b.fallbacks)
        if t and ":" in t
    }
    assert set(moved.MOVED) <= named, set(moved.MOVED) - named
    jit = {m for m in named if m.startswith("sglang.jit_kernel.")}
    # per_token_group_quant_8bit became per_token_group_quant, with another signature: not a move
    assert jit - set(moved.MOVED) == {"sglang.jit_kernel.per_token_group_quant_8bit"}
    assert moved.moved("sglang.jit_kernel.norm:rmsnorm") == "sglang.kernels.ops.layernorm.norm:rmsnorm"
    assert moved.moved("sgl_kernel:rmsnorm") is None and moved.moved("torch.ops.x.y.default") is None
