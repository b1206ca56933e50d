"""Twins measured once (dskbench/execution/twins.py): within a kernel by shape, across kernels by a declared
implementation; every declared claim held to what makes it true; a copy keeps its own kernel's identity."""

from __future__ import annotations

import inspect
import os
from collections import defaultdict
from dataclasses import fields

import pytest

os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")

import tests.fake_adapters  # noqa: E402,F401 - registers the fakes here whatever the variable held
from dskbench.adapters import adapters  # noqa: E402
from dskbench.adapters.backends import Backend  # noqa: E402
from dskbench.execution.runner import SweepOptions, WorkItem, plan_sweep, run_sweep  # noqa: E402
from dskbench.execution.twins import declared_implementation, measure_once  # noqa: E402
from dskbench.frontends import cli  # noqa: E402
from dskbench.results.io import read_runs  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry as _entry  # noqa: E402

DECODE_T = default_shapes().values("decode_tokens", "cpu")
N = len(DECODE_T)


def _item(index: int, kernel: str, t: int = 1, op: str = "input_layernorm", variant: str | None = None):
    case = {
        "kernel": kernel,
        "op": op,
        "variant": variant,
        "phase": "decode",
        "point": {"T": t},
        "dims": {"T": t, "D": 7168},
    }
    return WorkItem(index, kernel, "fake", case, "test")


def _opts(**kw) -> SweepOptions:
    base = dict(
        device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, measure_ceilings=False, seed=1
    )
    return SweepOptions(**{**base, **kw})


# -- the grouping --------------------------------------------------------------------------------------


def test_kernels_declaring_one_implementation_are_measured_once():
    items = [_item(0, "fake_twin_a"), _item(1, "fake_twin_b"), _item(2, "fake_twin_b", t=2)]
    run, copies = measure_once(items)
    assert [it.index for it in run] == [0, 2]  # other dims: measured
    assert {k: [it.index for it in v] for k, v in copies.items()} == {0: [1]}


def test_a_subclass_does_not_inherit_a_twin_claim():
    assert declared_implementation(tests.fake_adapters.FakeTwinHeir, "fake") is None
    assert tests.fake_adapters.FakeTwinHeir.implementation  # the attribute is there, inherited...
    run, copies = measure_once([_item(0, "fake_twin_a"), _item(1, "fake_twin_heir")])
    assert len(run) == 2 and copies == {}  # ...and claims nothing


def test_undeclared_kernels_pair_only_within_themselves():
    items = [
        _item(0, "fake_ok"),
        _item(1, "fake_ok", op="post_attention_layernorm"),  # same shape, other op: a twin
        _item(2, "fake_wrong"),  # same shape, other kernel, nothing declared: measured
        _item(3, "fake_ok", variant="v"),  # another variant: measured
        _item(4, "no_adapter_kernel"),  # a kernel without an adapter keeps the within-kernel rule
        _item(5, "no_adapter_kernel", op="post_attention_layernorm"),
    ]
    run, copies = measure_once(items)
    assert [it.index for it in run] == [0, 2, 3, 4]
    assert {k: [it.index for it in v] for k, v in copies.items()} == {0: [1], 4: [5]}


# -- every declared claim is true -----------------------------------------------------------------------

# What may differ between two adapters of one implementation: their names and texts, and their backend
# lists (a kernel may have backends its twin lacks).
OWN = {"kernel", "description", "backends", "implementation"}
# Backend fields that do not change what is launched or how it is gated and recorded.
BACKEND_TEXT = {"note"}


def _claims() -> dict[str, list[tuple[type, Backend]]]:
    out: dict[str, list[tuple[type, Backend]]] = defaultdict(list)
    for cls in adapters().values():
        for b in cls.backends:
            impl = declared_implementation(cls, b.name)
            if impl:
                out[impl].append((cls, b))
    return out


def _same_bind(a, b) -> bool:
    """Binders are the same function, or closures of one code over equal values (a binder factory's)."""
    if a is b:
        return True
    cells = [[c.cell_contents for c in (f.__closure__ or ())] for f in (a, b)]
    return a.__code__ is b.__code__ and cells[0] == cells[1]


def test_product_twins_are_the_verified_ones():
    kernels = {impl: sorted(cls.kernel for cls, _ in v) for impl, v in _claims().items()}
    product = {impl: ks for impl, ks in kernels.items() if not impl.startswith("tests.")}
    assert product == {
        **{
            f"flashinfer.mm_fp4[{b}]": ["cutlass_scaled_fp4_mm", "mm_fp4"]
            for b in ("cute-dsl", "cutlass", "cudnn", "trtllm")
        },
        **{
            f"flashinfer.fp4_quantize[{b}]": ["fp4_quantize", "scaled_fp4_quant"]
            for b in ("cuda", "cute-dsl")
        },
    }


def test_every_declared_twin_makes_the_same_call_on_the_same_inputs():
    for impl, claims in _claims().items():
        assert len(claims) >= 2, f"{impl}: declared by {claims[0][0].kernel} alone"
        (first_cls, first_b), *rest = claims
        for cls, b in rest:
            who = f"{impl}: {first_cls.kernel} / {cls.kernel}"
            assert b.name == first_b.name, f"{who}: one backend name, so (case_id, backend) names one record"
            for f in fields(Backend):
                if f.name in BACKEND_TEXT | {"bind"}:
                    continue
                assert getattr(b, f.name) == getattr(first_b, f.name), f"{who}: backend {f.name} differs"
            assert _same_bind(b.bind, first_b.bind), f"{who}: the binders differ"
            names = {n for c in (cls, first_cls) for n in dir(c) if not n.startswith("__")} - OWN
            for n in sorted(names):
                x, y = inspect.getattr_static(cls, n, None), inspect.getattr_static(first_cls, n, None)
                assert x is y or x == y, f"{who}: {n} differs (inputs, reference, check or traffic)"


# -- a sweep -------------------------------------------------------------------------------------------


@pytest.fixture()
def registry():
    reg = {k: _entry(k) for k in ("fake_twin_a", "fake_twin_b")}
    reg["fake_twin_b"].category = "other"
    return reg


@pytest.mark.parametrize("isolate", [True, False])
def test_a_cross_kernel_twin_is_measured_once_and_recorded_as_its_own_kernel(tmp_path, registry, isolate):
    items, skips = plan_sweep(registry, default_shapes(), list(registry), ["fake"], _opts())
    assert len(items) == 2 * N
    out = tmp_path / "r.jsonl"
    summary = run_sweep(items, skips, _opts(isolate=isolate), out)
    (run,) = read_runs([out])
    assert run.environment["settings"]["copied_items"] == N and summary.counts["ok"] == 2 * N
    by = {(r["kernel"], r["point"]["T"]): r for r in run.results}
    for t in DECODE_T:
        first, copy = by[("fake_twin_a", t)], by[("fake_twin_b", t)]
        assert "shared_with" not in first and copy["shared_with"] == first["case_id"]
        assert copy["case_id"].startswith("fake_twin_b/input_layernorm/") and copy["category"] == "other"
        assert copy["timing"] == first["timing"] and copy["seed"] == first["seed"]  # one measurement
        assert "--kernel fake_twin_b" in copy["repro"] and "--kernel fake_twin_a" in first["repro"]


def test_no_dedupe_measures_both_kernels(tmp_path, registry):
    items, skips = plan_sweep(registry, default_shapes(), list(registry), ["fake"], _opts())
    run_sweep(items, skips, _opts(isolate=False, dedupe=False), tmp_path / "r.jsonl")
    (run,) = read_runs([tmp_path / "r.jsonl"])
    assert run.environment["settings"]["copied_items"] == 0
    assert sorted(r["kernel"] for r in run.results) == ["fake_twin_a"] * N + ["fake_twin_b"] * N
    assert not any("shared_with" in r for r in run.results)


def test_the_no_dedupe_flag_reaches_the_sweep(tmp_path, monkeypatch, registry):
    seen = []

    def fake_run_sweep(items, skips, opts, out, progress=None):
        seen.append((opts.dedupe, sorted({it.kernel for it in items})))
        raise KeyboardInterrupt  # stop here: nothing to measure

    monkeypatch.setattr("dskbench.execution.runner.run_sweep", fake_run_sweep)
    monkeypatch.setattr(
        "dskbench.frontends.cli.common.registry_and_shapes", lambda: (registry, default_shapes())
    )
    monkeypatch.setattr("dskbench.registry.load.drift_message", lambda: None)
    base = [
        "run",
        "--device",
        "cpu",
        "--kernel",
        "fake_twin_a",
        "--kernel",
        "fake_twin_b",
        "--backend",
        "fake",
    ]
    for extra, want in (([], True), (["--no-dedupe"], False)):
        assert cli.main([*base, "--out", str(tmp_path / "r.jsonl"), *extra]) == 130
        assert seen.pop() == (want, ["fake_twin_a", "fake_twin_b"])
