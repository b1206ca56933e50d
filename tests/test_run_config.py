"""The one run configuration (dskbench.execution.config) and CUDA_VISIBLE_DEVICES read one way
(dskbench.device.visible): CPU, fake kernels."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("DSKBENCH_EXTRA_ADAPTERS", "tests.fake_adapters")

from dskbench.device.visible import visible_devices  # noqa: E402
from dskbench.execution.config import RunConfig, plan_run  # noqa: E402
from dskbench.execution.items import PlanError, SweepOptions  # noqa: E402
from dskbench.execution.selection import SelectionError  # noqa: E402
from dskbench.shapes.cases import default_shapes  # noqa: E402
from tests.fake_adapters import registry_entry as _entry  # noqa: E402

SHAPES = default_shapes()
DECODE_T = SHAPES.values("decode_tokens", "cpu")


@pytest.fixture()
def registry():
    import tests.fake_adapters  # noqa: F401 - registers the fakes

    reg = {n: _entry(n) for n in ("fake_ok", "fake_wrong")}
    reg["fake_ok"].op_names = ["input_layernorm", "post_attention_layernorm"]
    reg["fake_host"] = _entry("fake_host", "host-only", "host function, no GPU kernel")
    return reg


def _config(**kw) -> RunConfig:
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", budget_s=0.02, seed=1)
    return RunConfig(options=opts, **kw)


def test_config_round_trips_through_json_and_exposes_its_options():
    config = _config(kernels=("fake_ok",), ops=("input_layernorm",), points=({"T": 16},), all_backends=True)
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    # the default tp is every degree a deployment runs at; a profile measures those it sweeps
    assert (config.device, config.phases, config.profile, config.tp) == ("cpu", ("decode",), "cpu", (1, 4, 8))
    hot = config.with_options(mode="hot")
    assert hot.options.mode == "hot" and config.options.mode == "cold" and hot.kernels == config.kernels


def test_plan_run_selects_kernels_backends_ops_and_points(registry):
    items, skips = plan_run(_config(), registry, SHAPES)
    assert {i.kernel for i in items} == {"fake_ok", "fake_wrong"} and {i.backend for i in items} == {
        "torch-ref"
    }
    assert [s["kernel"] for s in skips] == ["fake_host"]
    items, skips = plan_run(
        _config(kernels=("fake_ok",), ops=("post_attention_layernorm",), points=({"T": DECODE_T[-1]},)),
        registry,
        SHAPES,
    )
    assert [(i.index, i.case["op"], i.case["point"]["T"]) for i in items] == [
        (0, "post_attention_layernorm", DECODE_T[-1])
    ]
    assert skips == []
    every = plan_run(_config(kernels=("fake_ok",), all_backends=True), registry, SHAPES)[0]
    assert {i.backend for i in every} == {"fake", "b200", "torch-ref"}


def test_plan_run_hands_the_unfiltered_plan_to_its_check(registry):
    seen = []

    def check(items, skips, replan):
        seen.append(
            (len(items), len(replan(SweepOptions(device="cpu", phases=("prefill",), profile="cpu"))[0]))
        )

    items, _ = plan_run(_config(kernels=("fake_ok",), points=({"T": DECODE_T[0]},)), registry, SHAPES, check)
    assert len(items) == 2  # one point, two ops
    assert seen[0][0] == 2 * len(DECODE_T) and seen[0][1] > 0


def test_plan_run_errors_name_what_is_wrong(registry):
    with pytest.raises(PlanError, match="unknown kernel 'fake_okk'"):
        plan_run(_config(kernels=("fake_okk",)), registry, SHAPES)
    with pytest.raises(SelectionError, match="--point T=3"):
        plan_run(_config(kernels=("fake_ok",), points=({"T": 3},)), registry, SHAPES)


@pytest.mark.parametrize(
    "value, tokens",
    [
        (None, None),
        ("", []),
        ("0,1", ["0", "1"]),
        (" GPU-abc , MIG-x ", ["GPU-abc", "MIG-x"]),
        ("2,,3", ["2"]),  # CUDA stops at the first empty entry
        ("1,", ["1"]),
    ],
)
def test_visible_devices_reads_cuda_visible_devices_as_cuda_does(value, tokens):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible_devices(env) == tokens


def test_the_default_tp_is_every_deployment_degree_a_profile_sweeps():
    """Per-rank shapes at tp 1, 4 and 8 by default; a profile keeps the degrees its shapes file sweeps."""
    from dskbench.execution.items import DEFAULT_TP
    from dskbench.frontends.cli.plan import swept_tp

    assert SweepOptions().tp == DEFAULT_TP == (1, 4, 8) and SHAPES.values("tp", "full") == [1, 4, 8]
    got = {
        prof: swept_tp(RunConfig(options=SweepOptions(device="cuda", profile=prof)), SHAPES).tp
        for prof in ("full", "quick", "cpu")
    }
    assert got == {"full": (1, 4, 8), "quick": (1, 8), "cpu": (1,)}
