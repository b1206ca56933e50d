"""scripts/evidence/build_seconds.py: the packaged build order refreshed from warm-up and run logs. A line two
processes wrote into each other must not become an entry; a longer finished build replaces an
`unfinished` bound, a shorter one does not."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "evidence" / "build_seconds.py"


def _script():
    spec = importlib.util.spec_from_file_location("build_seconds", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_logs_merge_into_the_file_longest_first(tmp_path, capsys):
    bs = _script()
    out = tmp_path / "build_seconds.json"
    out.write_text(
        json.dumps(
            {
                "about": "a",
                "seconds": [
                    {"kernel": "moe", "backend": "fi", "seconds": 1380, "unfinished": True},
                    {"kernel": "topk", "backend": "fi", "seconds": 300},
                    {"kernel": "quant · sglang_jit.v1warm: ok 0.0 s  fused", "backend": "x", "seconds": 11},
                ],
            }
        )
    )
    warm_log = tmp_path / "warm.log"
    warm_log.write_text(
        "warm: ok        409.0 s  topk · fi\n"
        "warm: ok         12.0 s  quant · sglang_jit.v1warm: ok          0.0 s  fused_moe_kernel · triton\n"
        "warm: error      99.0 s  broken · fi\n"
        "warm: ok          2.0 s  tiny · fi\n"
    )
    run_log = tmp_path / "run.log.gz"
    with gzip.open(run_log, "wt") as fh:
        fh.write("build: ok        900.0 s  moe · fi  (item  905.0 s, at    910 s)\n")
        fh.write("build: ok         20.4 s  rope · jit\n")
    assert bs.main([str(warm_log), str(run_log), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = [(r["kernel"], r["backend"], r["seconds"], r.get("unfinished", False)) for r in doc["seconds"]]
    assert rows == [("moe", "fi", 1380, True), ("topk", "fi", 409, False), ("rope", "jit", 20, False)]
    assert doc["about"] == "a" and len(doc["sources"]) == 2


def test_a_missing_log_is_one_line_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "build_seconds.json"
    out.write_text('{"seconds": []}')
    assert _script().main([str(tmp_path / "nope.log"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.log: no such file" in err[0]
    assert out.read_text() == '{"seconds": []}'


def test_the_packaged_file_names_only_real_builds():
    from dskbench.execution.build_times import packaged_build_times

    times = packaged_build_times()
    assert times and all(" " not in k and ":" not in b for k, b in times)
