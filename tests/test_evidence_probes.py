"""The evidence probes (scripts/evidence/*_probe.py, pdl_edges.py) on a machine without a GPU: their cases
are cases of the shapes file, what they read from results files is right, and without a GPU each says so
in one line."""

from __future__ import annotations

import importlib
import json

from dskbench.results.io import ResultsWriter, environment_record, result_record
from tests.evidence_support import EVIDENCE, assert_cases_exist, load_script


def test_timer_probe_cases_exist_and_take_the_sweeps_seeds(tmp_path, capsys, monkeypatch):
    """The timer probe's cases are cases of the shapes file (it would print 'no case' otherwise), and a
    results file gives each its seed, so the probe times the sweep's own inputs."""
    probe = load_script("timer_probe")
    ids = assert_cases_exist(probe.CASES)
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        w.write(
            environment_record("r", created="2026-11-27T00:00:00+00:00", device={"name": "H200"}, versions={})
        )
        timing = {"median_us": 1.0, "samples_us": [1.0]}
        for n, case_id in enumerate(ids):
            w.write(
                result_record(
                    "r", "ok", kernel="k", case_id=case_id, backend={"name": "b"}, seed=100 + n, timing=timing
                )
            )
    shared = importlib.import_module("probe_setup")  # beside the probes, on the path they set
    assert shared.seeds_from(path) == {case_id: 100 + n for n, case_id in enumerate(ids)}
    assert shared.seeds_from(None) == {}
    if __import__("torch").cuda.is_available():
        return
    monkeypatch.setattr("sys.argv", ["timer_probe.py"])
    assert probe.main() == 2
    assert capsys.readouterr().err.strip() == "timer_probe.py: needs a CUDA GPU"


def test_first_launch_probe_cases_exist_and_it_needs_a_gpu(capsys):
    """The first-launch probe's cases are cases of the shapes file, and on a machine without a GPU it says
    so in one line and exits 2."""
    probe = load_script("first_launch_probe")
    assert_cases_exist(probe.CASES)
    if __import__("torch").cuda.is_available():
        return
    assert probe.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_pdl_edges_split_counts_the_verdicts_of_each_kind_of_edge_apart(tmp_path, capsys):
    """split: compare's verdicts and the median change, counted apart for the cases flagged as following
    the flush over a programmatic edge; on a machine without a GPU, probe says so in one line."""
    from fake_results import fake_runs, write_runs

    pdl = load_script("pdl_edges")
    r1, r2, *_ = fake_runs()  # rmsnorm/sgl_kernel 25% slower in r2, silu_and_mul/flashinfer 15% faster
    old, new = write_runs([r1], tmp_path / "old.jsonl"), write_runs([r2], tmp_path / "new.jsonl")
    rows = [
        {"kernel": r["kernel"], "case_id": r["case_id"], "backend": r["backend"]["name"]}
        for r in r1.results
        if r.get("status") == "ok"
    ]
    flags = tmp_path / "pdl.jsonl"
    flags.write_text(
        "".join(
            json.dumps({**row, "programmatic_from_flush": int(row["kernel"] == "rmsnorm")}) + "\n"
            for row in rows
        )
    )
    assert pdl.main(["split", str(flags), str(old), "--", str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    prog = next(line for line in out if line.startswith("after the flush over a programmatic edge"))
    plain = next(line for line in out if line.startswith("after the flush over a plain edge"))
    assert " slower, 0 faster)" in prog and "0 slower, " in plain and " faster)" in plain
    kernels = [line for line in out if line.startswith("  verdicts by kernel")]
    assert kernels[0].startswith("  verdicts by kernel: rmsnorm ") and "rmsnorm" not in kernels[1]
    assert pdl.main(["split", str(flags)]) == 2  # usage
    if __import__("torch").cuda.is_available():
        return
    assert pdl.main(["probe", str(old)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_neighbor_probe_cases_exist_and_it_needs_a_gpu(capsys):
    """The neighbour probe's light and heavy cases are cases of the shapes file; without a GPU it says so
    in one line and exits 2."""
    probe = load_script("neighbor_probe")
    assert_cases_exist(probe.LIGHT + probe.HEAVY)
    if __import__("torch").cuda.is_available():
        return
    assert probe.main() == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_a_named_case_is_prepared_with_its_seed_or_says_in_one_line_why_not():
    """The probes' shared step: a case named as (kernel, op, phase, point, backend), prepared as a sweep
    prepares it, with the seed a results file gave it."""
    from dskbench.device.info import DeviceInfo
    from dskbench.execution.fidelity import prepare_named
    from dskbench.registry.load import load_registry
    from dskbench.shapes.cases import default_shapes

    shapes, registry, cpu = default_shapes(), load_registry(), DeviceInfo.detect("cpu")
    spec = ("rmsnorm", "input_layernorm", "decode", {"T": 1}, "torch-ref")
    case_id, prep = prepare_named(shapes, registry, spec, cpu, {"rmsnorm/input_layernorm/decode/T=1": 41})
    assert case_id == "rmsnorm/input_layernorm/decode/T=1" and prep.seed == 41
    assert prepare_named(shapes, registry, spec, cpu)[1].seed == 7
    why, prep = prepare_named(
        shapes, registry, ("rmsnorm", "input_layernorm", "decode", {"T": 3}, "torch-ref"), cpu
    )
    assert prep is None and why.startswith("rmsnorm: no case (")
    why, prep = prepare_named(shapes, registry, (*spec[:4], "sgl_kernel"), cpu)
    assert (
        prep is None
        and why == "rmsnorm/input_layernorm/decode/T=1: skipped: needs a CUDA GPU (found no CUDA GPU)"
    )


def test_pdl_edges_split_names_a_missing_or_malformed_file_in_one_line(tmp_path, capsys):
    pdl = load_script("pdl_edges")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert pdl.main(["split", str(tmp_path / "none.jsonl"), "a", "--", "b"]) == 2
    assert pdl.main(["split", str(bad), "a", "--", "b"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "none.jsonl" in lines[0]
    assert lines[1] == f"pdl_edges.py: {bad}:1: not a line of `pdl_edges.py probe` output"


def test_timer_arbiter_says_which_timer_the_per_case_graphs_cupti_reading_is_nearer(tmp_path, capsys):
    """Each slower/faster case with both timers' kernel times and their cross-checks, and the side the
    per-case record's CUPTI reading is nearer; a missing file is one line, no trace."""
    import copy

    from fake_results import fake_runs, write_runs

    arb = load_script("timer_arbiter")
    r1, r2, *_ = fake_runs()  # rmsnorm/sgl_kernel 25% slower in r2, silu_and_mul/flashinfer 15% faster
    r1 = copy.deepcopy(r1)
    new = {(r["case_id"], r["backend"]["name"]): r for r in r2.results if r.get("status") == "ok"}
    for r in r1.results:
        if r.get("status") != "ok":
            continue
        other = new.get((r["case_id"], r["backend"]["name"]))
        # CUPTI in the per-case graph reads rmsnorm as the batched side does, everything else as per-case
        cupti = r["timing"]["median_us"]
        if r["kernel"] == "rmsnorm" and other is not None:
            cupti = other["timing"]["median_us"]
        r["timing"].update(launch_gap_us=0.5, cross_check={"method": "cupti", "median_us": cupti + 0.5})
    old, newf = write_runs([r1], tmp_path / "old.jsonl"), write_runs([r2], tmp_path / "new.jsonl")
    assert arb.main([str(old), "--", str(newf)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out[1:] if line.endswith(("batched", "per-case"))]
    assert rows and all(line.startswith(("rmsnorm ", "silu_and_mul ")) for line in rows)
    assert all(line.endswith("batched") == line.startswith("rmsnorm ") for line in rows)
    assert any(line.startswith("rmsnorm ") for line in rows) and any(line.startswith("silu") for line in rows)
    summary = next(line for line in out if "slower/faster cases" in line)
    assert summary.startswith(f"{len(rows)} slower/faster cases")
    assert arb.main([str(old)]) == 2  # usage
    assert arb.main([str(tmp_path / "none.jsonl"), "--", str(newf)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("timer_arbiter.py: ") and "none.jsonl" in err[-1]


def test_placement_probe_cases_exist_and_it_needs_a_gpu(capsys, monkeypatch):
    """The placement probe's cases are cases of the shapes file, its paddings distinct; without a GPU it
    says so in one line and exits 2."""
    probe = load_script("placement_probe")
    assert_cases_exist(probe.CASES + probe.BESIDE)
    assert len(set(probe.PADDINGS_KB)) == len(probe.PADDINGS_KB) > 1
    assert len(set(probe.SEGMENT_FILLS)) == len(probe.SEGMENT_FILLS) > 1
    torch = __import__("torch")
    a, b = torch.empty(1 << 20, dtype=torch.uint8), torch.empty(3 << 20, dtype=torch.uint8)
    seg_a, off_a = divmod(a.data_ptr(), 2 << 20)
    seg_b, off_b = divmod(b.data_ptr(), 2 << 20)
    probe._FIRST_SEGMENT[:] = []
    assert probe.addresses({"a": a, "n": 3}) == f"a@0:{off_a // 1024}K"  # the first segment seen counts 0
    assert probe.addresses({"b": b}) == f"b@{seg_b - seg_a}:{off_b // 1024}K"
    assert probe.CASES[0] not in probe.BESIDE and probe.BESIDE
    if __import__("torch").cuda.is_available():
        return
    monkeypatch.setattr("sys.argv", ["placement_probe.py"])
    assert probe.main() == 2
    assert capsys.readouterr().err.strip() == "placement_probe.py: needs a CUDA GPU"
    monkeypatch.setattr("sys.argv", ["placement_probe.py", "--seeds-from", "/nonexistent/r.jsonl"])
    assert probe.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("placement_probe.py: ") and "r.jsonl" in err[0]


def test_a_probe_times_a_case_as_the_sweep_does(monkeypatch):
    """Probe.per_case: the cold per-case event timer with the probe's settings; Probe.batched: the cases'
    launchers in one batch, a result for each."""
    import types

    from dskbench import measure as core
    from dskbench.measure import batch

    monkeypatch.syspath_prepend(str(EVIDENCE))
    shared = importlib.import_module("probe_setup")
    calls = []
    monkeypatch.setattr(
        core, "measure", lambda launchers, **kw: calls.append(("per-case", launchers, kw)) or 1.0
    )
    monkeypatch.setattr(
        batch,
        "measure_batch",
        lambda entries, **kw: calls.append(("batched", entries, kw)) or [2.0] * len(entries),
    )
    settings = object()
    probe = shared.Probe(None, None, None, settings, {})
    a, b = types.SimpleNamespace(launch="A"), types.SimpleNamespace(launch="B")
    assert probe.per_case(a) == 1.0 and probe.batched([a, b]) == [2.0, 2.0]
    assert calls[0] == (
        "per-case",
        ["A"],
        {"device": "cuda", "mode": "cold", "capturable": True, "settings": settings},
    )
    assert calls[1] == ("batched", [["A"], ["B"]], {"device": "cuda", "settings": settings})
