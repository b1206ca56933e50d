"""`--model` on run, warm and list (DeepSeek-R1 = the ops without `models`, DeepSeek-V3.2 = the ops that
list it), the list's models column, and the run configuration carrying the models (CPU)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shlex
from types import SimpleNamespace

import pytest

from dskbench.execution.config import RunConfig, plan_run
from dskbench.execution.items import SweepOptions
from dskbench.execution.selection import SelectionError, filter_models, repro_command
from dskbench.frontends import cli
from dskbench.frontends.cli.kernels import kernel_models, models_text
from dskbench.registry.load import load_registry
from dskbench.shapes.cases import default_shapes
from dskbench.shapes.models import ModelError, op_models, parse_model, short_name

SHAPES = default_shapes()
V32_OPS = {name for name, spec in SHAPES.ops.items() if "deepseek-v3.2" in spec.models}
R1_OPS = {name for name, spec in SHAPES.ops.items() if "deepseek-r1" in op_models(spec.models)}


@pytest.fixture(autouse=True)
def _no_drift_check(monkeypatch):
    monkeypatch.setattr("dskbench.registry.load.drift_message", lambda *a, **k: None)  # checked elsewhere


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def _dry(*extra: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(case id, backend) pairs and the kernels skipped at planning of a CPU dry run."""
    rc, out, err = _main(["run", "--device", "cpu", "--sweep", "all", "--dry-run", *extra])
    assert rc == 0, err
    lines = out.splitlines()
    cases = [tuple(line.split("  ")) for line in lines if line.count("  ") == 1 and "skipped:" not in line]
    skipped = [line.split("  ")[0] for line in lines if "  skipped: " in line]
    return cases, skipped


def _op(case_id: str) -> str:
    return case_id.split("/")[1].partition(":")[0]


def test_the_shapes_file_marks_the_nsa_ops_as_deepseek_v32s():
    assert V32_OPS == {
        "nsa_indexer.forward",
        "nsa_backend.forward_decode",
        "nsa_backend.forward_extend",
        "dsa_kv_cache_store",
    }
    assert not V32_OPS & R1_OPS and "input_layernorm" in R1_OPS


# DeepSeek-V3.2's Triton kernels of the NSA files the traces name (traces/triton_kernels.yaml), and those
# of them that have no adapter yet
V32_FILE_KERNELS = {
    "_gather_dequant_requant_fp8_paged_kernel",
    "_get_k_and_s_triton_kernel",
    "_quantize_k_cache_fast_kernel",
    "_set_k_and_s_triton_kernel",
}
V32_FILE_KERNELS_WITHOUT_ADAPTER: set[str] = set()


def test_model_names():
    assert parse_model("deepseek-v3.2") == parse_model(" DeepSeek-V3.2 ") == "deepseek-v3.2"
    with pytest.raises(
        ModelError, match=r"unknown model 'deepseek-v4'; known models: deepseek-r1, deepseek-v3.2"
    ):
        parse_model("deepseek-v4")
    assert op_models(()) == ("deepseek-r1",) and op_models(["deepseek-v3.2"]) == ("deepseek-v3.2",)
    assert (short_name("deepseek-r1"), short_name("deepseek-v3.2")) == ("R1", "V3.2")


# -- run and warm ---------------------------------------------------------------------------------------------


def test_run_model_selects_the_ops_that_model_runs():
    every, every_skipped = _dry()
    r1, r1_skipped = _dry("--model", "deepseek-r1")
    v32, v32_skipped = _dry("--model", "deepseek-v3.2")
    assert r1 and v32
    assert {_op(c) for c, _ in v32} == V32_OPS  # every NSA op, nothing else
    assert {_op(c) for c, _ in r1} <= R1_OPS and not {_op(c) for c, _ in r1} & V32_OPS
    assert {"fast_topk_v2", "layernorm", "act_quant"} <= {c.split("/")[0] for c, _ in v32}
    # the two models split the default plan (it keeps every op, as before)
    assert sorted(r1 + v32) == sorted(every)
    assert _dry("--model", "deepseek-r1", "--model", "deepseek-v3.2")[0] == every
    assert _dry("--model", "DeepSeek-V3.2")[0] == v32
    # kernels skipped at planning stay when one of their ops is the model's
    # (every V3.2 kernel of the traced NSA files has an adapter: none of them is skipped)
    assert "custom_all_reduce" in r1_skipped and set(v32_skipped) <= V32_FILE_KERNELS_WITHOUT_ADAPTER
    assert set(r1_skipped) <= set(every_skipped)


@pytest.mark.parametrize("command", ["run", "warm", "list"])
def test_an_unknown_model_is_one_line_exit_2(command):
    rc, out, err = _main(
        [command, "--model", "deepseek-v4"] + (["--device", "cpu"] if command != "list" else [])
    )
    assert rc == cli.EXIT_USAGE and out == ""
    assert err.count("\n") == 1 and err.startswith("dskbench: ")
    assert "'deepseek-v4'" in err and "deepseek-r1, deepseek-v3.2" in err


def test_a_model_that_leaves_no_case_is_the_empty_plan_error():
    rc, _, err = _main(
        ["run", "--device", "cpu", "--kernel", "rmsnorm", "--model", "deepseek-v3.2", "--dry-run"]
    )
    assert rc == cli.EXIT_USAGE and err.count("\n") == 1
    assert err.startswith("dskbench: nothing to run: the selected kernels have no case")
    assert "none of their ops is one DeepSeek-V3.2 runs (--model deepseek-v3.2;" in err


def test_the_repro_of_a_model_selected_case_needs_no_model():
    v32, _ = _dry("--model", "deepseek-v3.2")
    from dskbench.frontends.cli.common import registry_and_shapes
    from dskbench.frontends.cli.plan import plan

    reg, shapes = registry_and_shapes()
    opts = SweepOptions(device="cpu", phases=cli.SWEEPS, profile="cpu", budget_s=0.2)
    items, _ = plan(RunConfig(options=opts, models=("deepseek-v3.2",)), reg, shapes)
    assert sorted((it.case_id, it.backend) for it in items) == sorted(v32)
    settings = {**dataclasses.asdict(opts), "run_seed": 3}
    for it in items:
        args = shlex.split(repro_command(it.identity(), settings))
        assert "--model" not in args and "--op" in args
        rc, out, err = _main([*args[1:], "--dry-run"])
        assert rc == 0, err
        assert [tuple(x.split("  ")) for x in out.splitlines() if x.count("  ") == 1] == [
            (it.case_id, it.backend)
        ]


def test_warm_takes_the_model(monkeypatch):
    seen = []
    monkeypatch.setattr("dskbench.execution.warm_report.warm", lambda items, *a, **k: seen.extend(items))
    assert cli.main(["warm", "--device", "cpu", "--model", "deepseek-v3.2"]) == 0
    assert seen and {it.case["op"] for it in seen} == V32_OPS


# -- the run configuration (every front end) ------------------------------------------------------------------


def test_run_config_carries_and_checks_the_models():
    opts = SweepOptions(device="cpu", phases=("decode",), profile="cpu", budget_s=0.02)
    config = RunConfig(options=opts, kernels=("fast_topk_v2", "rmsnorm"), models=("deepseek-v3.2",))
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    old = {k: v for k, v in config.to_json().items() if k != "models"}  # a config written before --model
    assert RunConfig.from_json(old).models == ()
    registry = load_registry()
    items, _ = plan_run(config, registry, SHAPES)
    assert items and {it.kernel for it in items} == {"fast_topk_v2"}
    assert [it.index for it in items] == list(range(len(items)))
    with pytest.raises(SelectionError, match="unknown model 'r2'"):
        plan_run(dataclasses.replace(config, models=("r2",)), registry, SHAPES)


@dataclasses.dataclass(frozen=True)
class _Item:
    index: int
    case: dict


def test_filter_models_keeps_cases_and_skips_of_the_models_ops():
    items = [_Item(i, {"op": op}) for i, op in enumerate(["a", "b", "a", "b"])]
    skips = [{"kernel": "ka"}, {"kernel": "kb"}, {"kernel": "none"}]
    models = {"a": ("deepseek-r1",), "b": ("deepseek-v3.2",)}.__getitem__
    ops = {"ka": ("a",), "kb": ("b",), "none": ()}.__getitem__
    assert filter_models(items, skips, (), models, ops) == (items, skips)
    kept, kept_skips = filter_models(items, skips, ("deepseek-v3.2",), models, ops)
    assert kept == [_Item(0, {"op": "b"}), _Item(1, {"op": "b"})]  # renumbered
    assert kept_skips == [{"kernel": "kb"}]


# -- list -----------------------------------------------------------------------------------------------------


def test_list_shows_the_models_column_and_filters_by_model():
    rc, out, _ = _main(["list"])
    assert rc == 0
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:6] == ["kernel", "category", "source", "status", "models", "ops"]
    row = {line.split()[0]: line for line in lines[1:-1]}
    assert "  V3.2  " in row["fast_topk_v2"] and "  R1  " in row["rmsnorm"]
    assert "  V3.2  " in row["layernorm"]  # no op in its registry entry: the ops its adapter picks
    assert "  -  " in row["cutlass_moe_gemm"]  # absent: no op any model runs
    rc, out, _ = _main(["list", "--model", "deepseek-v3.2"])
    kernels = {line.split()[0] for line in out.splitlines()[1:-1]}
    assert (
        kernels
        == {
            "act_quant",
            "fast_topk_transform_fused",
            "fast_topk_transform_ragged_fused",
            "fast_topk_v2",
            "flash_mla_sparse_fwd",
            "flash_mla_with_kvcache",  # dense at attn_mqa (R1 and V3.2), sparse at V3.2's sparse decode
            "hadamard_transform",
            "layernorm",
        }
        | V32_FILE_KERNELS
    )
    assert (
        out.splitlines()[-1]
        == f"{len(kernels)} kernels, {len(kernels - V32_FILE_KERNELS_WITHOUT_ADAPTER)} with an adapter"
    )
    rc, out, _ = _main(["list", "--model", "deepseek-r1"])
    assert "rmsnorm" in out and "fast_topk_v2" not in out and "cutlass_moe_gemm" not in out


def test_list_json_carries_the_model_names():
    rc, out, _ = _main(["list", "--json"])
    rows = {r["kernel"]: r for r in json.loads(out)}
    assert rows["fast_topk_v2"]["models"] == ["deepseek-v3.2"] and rows["rmsnorm"]["models"] == [
        "deepseek-r1"
    ]
    assert rows["cutlass_moe_gemm"]["models"] == []
    rc, out, _ = _main(["list", "--json", "--model", "deepseek-v3.2", "--status", "benchmark"])
    v32 = {r["kernel"]: r["models"] for r in json.loads(out)}
    assert rc == 0 and all("deepseek-v3.2" in m for m in v32.values())
    assert v32["fast_topk_v2"] == ["deepseek-v3.2"]
    assert v32["flash_mla_with_kvcache"] == ["deepseek-r1", "deepseek-v3.2"]  # dense decode and sparse decode


def test_a_kernel_of_both_models_reads_r1_v32():
    op = SimpleNamespace
    entry = SimpleNamespace(
        ops=(
            op(name="x", executed=True, models=()),
            op(name="y", executed=True, models=("deepseek-v3.2",)),
            op(name="z", executed=False, models=()),
        )
    )
    assert kernel_models(entry, None, SHAPES) == ["deepseek-r1", "deepseek-v3.2"]
    assert models_text(["deepseek-r1", "deepseek-v3.2"]) == "R1, V3.2" and models_text([]) == "-"
    only_not_run = SimpleNamespace(ops=(op(name="z", executed=False, models=()),))
    assert kernel_models(only_not_run, None, SHAPES) == []
