"""`dskbench run-to-run` (spread of two sweeps) and `dskbench pack` (results packed for committing): the
figures the results READMEs quote come from these, so they are checked on known files. And
scripts/evidence/: the step runner (limits, logs, resuming) and the plans' commands."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from dskbench.frontends.cli import EXIT_USAGE, main
from dskbench.results.io import ResultsWriter, environment_record, read_runs, result_record

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, medians: dict[str, float], extra: list[dict] = ()) -> Path:
    with ResultsWriter(path) as w:
        w.write(
            environment_record("r", created="2026-11-21T00:00:00+00:00", device={"name": "H200"}, versions={})
        )
        for case, us in medians.items():
            w.write(
                result_record(
                    "r",
                    "ok",
                    kernel="k",
                    case_id=case,
                    backend={"name": "b"},
                    timing={"median_us": us, "samples_us": [us * 1.0000001234, us]},
                )
            )
        for rec in extra:
            w.write(result_record("r", rec.pop("status"), **rec))
    return path


def test_run_to_run_pairs_ok_cases_and_leaves_copies_out(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", {"c1": 2.0, "c2": 10.0, "c3": 100.0, "c4": 1.0})
    copy = {"status": "ok", "kernel": "k", "case_id": "c5", "backend": {"name": "b"}, "shared_with": "c1"}
    copy["timing"] = {"median_us": 1.0}
    wrong = {"status": "wrong", "kernel": "k", "case_id": "c4", "backend": {"name": "b"}, "reason": "x"}
    b = _write(tmp_path / "b.jsonl", {"c1": 2.2, "c2": 9.9, "c3": 100.0}, [copy, wrong])
    out = tmp_path / "r.json"
    assert main(["run-to-run", str(a), str(b), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["all"]["pairs"] == 3  # c4 is wrong in b; c5 is a copy of c1's measurement
    assert doc["all"]["median_abs_pct"] == 1.0 and doc["all"]["max_abs_pct"] == 10.0
    assert doc["bands"]["0-5 us"]["pairs"] == 1 and doc["bands"]["100-1000 us"]["median_abs_pct"] == 0.0
    assert doc["largest"][0]["case"] == "c1" and doc["largest"][0]["delta_pct"] == 10.0
    assert "3 pairs: median |delta| 1.0%" in capsys.readouterr().out
    only = tmp_path / "only.jsonl"
    _write(only, {"c2": 1.0})
    assert main(["run-to-run", str(a), str(b), "--only-common", str(only), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["all"]["pairs"] == 1
    capsys.readouterr()
    empty = _write(tmp_path / "e.jsonl", {})
    assert main(["run-to-run", str(a), str(empty)]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"dskbench: {a} and {empty}: no (case, backend) is measured ok in both files: nothing to compare\n"
    )


def test_pack_rounds_samples_only_and_the_reader_reads_it(tmp_path, capsys):
    src = _write(tmp_path / "a.jsonl", {"c1": 2.7850000858306885})
    dst = tmp_path / "a.jsonl.gz"
    assert main(["pack", str(src), str(dst)]) == 0
    before = [json.loads(x) for x in src.read_text().splitlines()]
    after = [json.loads(x) for x in gzip.open(dst, "rt")]
    assert len(after) == len(before)
    assert after[1]["timing"]["samples_us"] == [2.785, 2.785]
    assert after[1]["timing"]["median_us"] == before[1]["timing"]["median_us"]  # not rounded
    for b, a in zip(before, after, strict=True):
        b.get("timing", {}).pop("samples_us", None)
        a.get("timing", {}).pop("samples_us", None)
        assert a == b
    (run,) = read_runs([dst])
    assert run.results[0]["case_id"] == "c1"
    assert main(["pack", str(src), str(tmp_path / "x.jsonl")]) == EXIT_USAGE  # must be written gzipped
    assert "x.jsonl: the packed file is gzipped: give a name ending in .gz" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


# -- scripts/evidence: the step runner and the plans ---------------------------------------------------

EVIDENCE = ROOT / "scripts" / "evidence"


def _bash(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script, "plan", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


PLAN = """set -uo pipefail
source scripts/evidence/steps.sh "$1" || exit $?
step ok 60 bash -c 'echo made > "$0/made.txt"; echo out' "$out"
step fails 60 bash -c 'echo no; exit 3'
step cut 1 sleep 600
step after 60 true
"""


def _steps(out: Path) -> list[str]:
    return [" ".join(ln.split()[1:3]) for ln in (out / "steps.log").read_text().splitlines()]


def test_steps_limit_log_and_resume(tmp_path):
    """Each step under its own limit, logs in OUT; a second run skips the steps that finished."""
    out = tmp_path / "out"
    p = _bash(PLAN, str(out))
    assert p.returncode == 0, p.stderr
    log = (out / "steps.log").read_text()
    assert "end   ok exit code 0" in log and "end   fails exit code 3" in log
    assert "end   cut exit code 124" in log  # killed at its 1 s limit (timeout's code), the plan went on
    assert "end   after exit code 0" in log
    assert (out / "ok.log").read_text() == "out\n" and (out / "fails.log").read_text() == "no\n"
    assert (out / "steps.done").read_text().split() == ["ok", "after"]
    (out / "made.txt").unlink()
    assert _bash(PLAN, str(out)).returncode == 0  # again into the same OUT: only what did not finish
    assert not (out / "made.txt").exists()
    again = _steps(out)[8:]
    assert again == ["skip ok", "start fails", "end fails", "start cut", "end cut", "skip after"]


def test_steps_needs_an_output_folder():
    p = _bash("source scripts/evidence/steps.sh")
    assert p.returncode == 2 and "give the output folder" in p.stderr


def _plan(name: str, out: Path, *args: str, **env: str) -> tuple[list[list[str]], list[str]]:
    """The steps a plan would run (EVIDENCE_DRY_RUN=1): their commands as argument lists, and the lines."""
    env = {"EVIDENCE_DRY_RUN": "1", **env}
    os_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = subprocess.run(
        ["bash", str(EVIDENCE / name), str(out), *args],
        cwd=ROOT,
        env={**os_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    steps = [ln for ln in p.stdout.splitlines() if ln.startswith("step ")]
    return [shlex.split(ln.split(": ", 1)[1]) for ln in steps], steps


@pytest.mark.parametrize("gpus", ["1", "2", "4"])
def test_sweep_plan_runs_commands_that_exist(tmp_path, gpus):
    """Every dskbench command of the plan parses as dskbench's own; every script it names exists."""
    from dskbench.frontends.cli import build_parser

    cmds, lines = _plan("sweep.sh", tmp_path / "o", EVIDENCE_GPUS=gpus)
    names = [ln.split()[1] for ln in lines]
    assert {"warm", "asv", "sweep-a", "sweep-b", "fidelity", "insitu", "r2r-sweep"} <= set(names)
    assert len(names) == len(set(names))  # a step name is its log's and its resume key
    runs = []
    for cmd in cmds:
        if cmd[:3] == ["python3", "-m", "dskbench"]:
            build_parser().parse_args(cmd[3:])  # exits 2 on a flag dskbench does not have
            runs.append(cmd[3])
        elif cmd[0] in ("python3", "bash") and cmd[1].startswith("scripts/"):
            assert (ROOT / cmd[1]).exists(), cmd
    assert runs.count("run") + runs.count("warm") == 7  # warm, two sweeps, two runs of each flush kind
    assert {"fidelity", "insitu", "stats", "run-to-run"} <= set(runs)  # the rest: dskbench commands too
    warm = next(ln for ln in lines if ln.startswith("step warm "))
    asv = next(ln for ln in lines if ln.startswith("step asv "))
    if gpus == "4":  # warm on three GPUs while asv has the fourth
        assert "[CUDA_VISIBLE_DEVICES=0,1,2]" in warm and "[CUDA_VISIBLE_DEVICES=3]" in asv
    if gpus == "1":
        assert "CUDA_VISIBLE_DEVICES" not in warm + asv


def test_plans_use_the_jobs_own_gpus_and_refuse_too_few(tmp_path):
    from dskbench.frontends.cli import build_parser

    cmds, lines = _plan("multi_gpu.sh", tmp_path / "o", CUDA_VISIBLE_DEVICES="3,5")
    comm = next(c for c in cmds if c[:4] == ["python3", "-m", "dskbench", "comm"])
    build_parser().parse_args(comm[3:])  # exits 2 on a flag `dskbench comm` does not have
    assert comm[comm.index("--nproc") + 1] == "2" and comm[-1].endswith("comm-tp2.jsonl")
    assert all("[CUDA_VISIBLE_DEVICES=3,5]" in ln for ln in lines)  # a scheduler's allocation, kept
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    for plan, n, msg in (("multi_gpu.sh", "1", "needs two or more GPUs"), ("sweep.sh", "0", "no GPU found")):
        p = subprocess.run(
            ["bash", str(EVIDENCE / plan), str(tmp_path / "x")],
            env={**env, "EVIDENCE_GPUS": n},  # said, so nvidia-smi is not asked
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and msg in p.stderr
    p = subprocess.run(["bash", str(EVIDENCE / "sweep.sh")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "usage: bash scripts/evidence/sweep.sh OUT" in p.stderr


def test_timers_plan_interleaves_the_two_timers_over_one_subset(tmp_path):
    """The timers plan: per-case, batched, per-case, batched over one subset (the options given, or the
    sgl_kernel backend at tp 1), each a valid dskbench command line on the job's first GPU; compare
    takes two runs a side."""
    from dskbench.frontends.cli import build_parser

    for extra, want in (([], ["--backend", "sgl_kernel", "--point", "tp=1"]), (["--quick"], ["--quick"])):
        cmds, lines = _plan("timers.sh", tmp_path / "o", *extra, CUDA_VISIBLE_DEVICES="2,3")
        runs = [c for c in cmds if c[:4] == ["python3", "-m", "dskbench", "run"]]
        for c in runs:
            build_parser().parse_args(c[3:])
            assert c[4 : 4 + len(want)] == want
        names = [c[-1].rsplit("/", 1)[1] for c in runs]
        assert names == ["per-case-1.jsonl", "batched-1.jsonl", "per-case-2.jsonl", "batched-2.jsonl"]
        assert ["--no-batch" in c for c in runs] == [True, False, True, False]
        assert all("[CUDA_VISIBLE_DEVICES=2]" in ln for ln in lines)
        summary = cmds[-1][2]
        assert 'compare "$p1" "$p2" -- "$b1" "$b2"' in summary


def test_shared_gpu_plan_refuses_then_runs_beside_then_waits(tmp_path):
    """Beside a busy process: the same run with --exclusive (to be refused), without (to be flagged), and
    with --wait-exclusive outlasting the busy process; each a valid dskbench command line."""
    from dskbench.frontends.cli import build_parser

    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = subprocess.run(
        ["bash", str(EVIDENCE / "shared_gpu.sh"), str(tmp_path / "o")],
        cwd=ROOT,
        env={**env, "EVIDENCE_DRY_RUN": "1", "BUSY_SECONDS": "100"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    runs = {ln.split(":")[0].split()[1]: shlex.split(ln.split(": ", 1)[1]) for ln in p.stdout.splitlines()}
    assert list(runs) == ["exclusive", "beside", "waited"]
    for cmd in runs.values():
        assert cmd[:4] == ["python3", "-m", "dskbench", "run"]
        build_parser().parse_args(cmd[3:])
    assert "--exclusive" in runs["exclusive"] and "--exclusive" not in runs["beside"]
    waited = runs["waited"]
    assert int(waited[waited.index("--wait-exclusive") + 1]) > 100  # outlasts the busy process


def test_versions_plan_installs_each_release_once_warms_it_then_interleaves_the_runs(tmp_path):
    """Each release installed once into its own folder and warmed there; then A, B, A, B: each run with
    its side's folder first on PYTHONPATH and its own FlashInfer JIT cache, checking the version before
    it measures, the same dskbench command line (the options given, or the quick sweep), its own file;
    compare then takes two runs a side."""
    from dskbench.frontends.cli import build_parser

    for extra, want in ((["--kernel", "rmsnorm"], ["--kernel", "rmsnorm"]), ([], ["--quick"])):
        out = tmp_path / "o"
        cmds, lines = _plan("versions.sh", out, "lib==1.0", "./lib-2.0.whl", *extra, EVIDENCE_GPUS="1")
        names = [ln.split()[1] for ln in lines]
        assert names == [
            "probe",
            "install-A",
            "warm-A",
            "install-B",
            "warm-B",
            "A-1",
            "B-1",
            "A-2",
            "B-2",
            "summaries",
        ]
        by_name = dict(zip(names, cmds, strict=True))
        for side, spec in (("A", "lib==1.0"), ("B", "./lib-2.0.whl")):
            env = [f"PYTHONPATH={out}/site-{side}:", f"VERSIONS_PIP_TARGET={out}/site-{side}"]
            env.append(f"FLASHINFER_WORKSPACE_BASE={out}/jit-{side}")
            for name in (f"install-{side}", f"warm-{side}", f"{side}-1", f"{side}-2"):
                cmd = by_name[name]
                assert cmd[0] == "env" and cmd[1].startswith(env[0]) and cmd[2:4] == env[1:], (name, cmd)
            assert by_name[f"install-{side}"][4:] == ["bash", "scripts/evidence/install_spec.sh", spec]
            warm = by_name[f"warm-{side}"][4:]
            assert warm[:4] == ["python3", "-m", "dskbench", "warm"] and warm[4:] == want
            build_parser().parse_args(warm[3:])
            for n in (1, 2):
                run = by_name[f"{side}-{n}"][4:]
                assert run[:2] == ["bash", "-c"] and run[2].startswith(
                    "bash scripts/evidence/install_spec.sh --check "
                )
                assert "exec python3 -m dskbench run " in run[2] and run[4] == spec
                args = run[5:]
                build_parser().parse_args(["run", *args])
                assert args[: len(want)] == want and args[-1] == f"{out}/{side}-{n}.jsonl"
        assert "compare" in cmds[-1][2] and " -- " in cmds[-1][2]
        assert [a.rsplit("/", 1)[1] for a in cmds[-1][4:]] == [
            "A-1.jsonl",
            "A-2.jsonl",
            "B-1.jsonl",
            "B-2.jsonl",
        ]


def test_versions_plan_measures_nothing_until_both_sides_install(tmp_path):
    """A side whose install fails (here: a folder with no wheel yet) stops the plan before any run, with
    a line saying how to go on; its warm step does not run against whatever else python3 would import."""
    empty = tmp_path / "wheels-not-yet"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = tmp_path / "o"
    p = subprocess.run(
        ["bash", str(EVIDENCE / "versions.sh"), str(out), str(empty), str(empty), "--kernel", "rmsnorm"],
        cwd=ROOT,
        env={**env, "EVIDENCE_GPUS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1 and "a side is not installed" in p.stderr and "run the plan again" in p.stderr
    started = [ln.split()[2] for ln in (out / "steps.log").read_text().splitlines() if " start " in ln]
    assert started == ["probe", "install-A", "install-B"]
    assert "no *.whl in" in (out / "install-A.log").read_text()


def _wheel(folder: Path, version: str) -> Path:
    """A wheel of the project `demo-lib` (module demo_lib) at `version`, made here."""
    import base64
    import hashlib
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"demo_lib-{version}-py3-none-any.whl"
    info = f"demo_lib-{version}.dist-info"
    files = {
        "demo_lib/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo-lib\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*rows, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _install(
    spec: str, tmp_path: Path, pythonpath: str, *flags: str, **env: str
) -> subprocess.CompletedProcess:
    import sys

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "python3").exists():
        (bindir / "python3").symlink_to(sys.executable)  # the python3 the script runs: this one, with pip
    os_env = {k: v for k, v in os.environ.items() if not k.startswith(("VERSIONS_", "PIP_"))}
    env = {**os_env, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": pythonpath, **env}
    cmd = ["bash", str(EVIDENCE / "install_spec.sh"), *flags, spec]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_install_spec_installs_into_the_target_python_imports_from_and_checks_it(tmp_path):
    """VERSIONS_PIP_TARGET: each SPEC goes into the folder on PYTHONPATH, the old version's metadata
    removed, and the step says which version python3 then finds; it fails when that is not the one asked
    for, or when the folder is not where python3 imports the module from."""
    pytest.importorskip("pip")
    w1, w2 = _wheel(tmp_path / "w1", "1.0"), _wheel(tmp_path / "w2", "2.0.post1")
    site = tmp_path / "site"
    env = {"VERSIONS_PIP_TARGET": str(site), "VERSIONS_PIP_ARGS": "--no-index --no-cache-dir"}
    p = _install(str(w1), tmp_path, str(site), **env)
    assert p.returncode == 0, p.stderr
    assert f"demo-lib 1.0 in {site.resolve()} (demo_lib from {site.resolve()}/demo_lib" in p.stdout
    # B as a folder of wheels; then A again, as a space-separated list
    for spec, want in ((str(w2.parent), "2.0.post1"), (f"{w1} ", "1.0")):
        p = _install(spec, tmp_path, str(site), **env)
        assert p.returncode == 0, p.stderr
        assert f"demo-lib {want} in " in p.stdout
        assert [d.name for d in site.glob("*.dist-info")] == [f"demo_lib-{want}.dist-info"]
        assert (site / "demo_lib" / "__init__.py").read_text() == f"__version__ = {want!r}\n"
    # --check: the version python3 finds, nothing installed
    p = _install(str(w1), tmp_path, str(site), "--check", **env)
    assert p.returncode == 0 and "demo-lib 1.0 in " in p.stdout
    p = _install(str(w2), tmp_path, str(site), "--check", **env)
    assert p.returncode == 1 and "python3 finds 1.0, not 2.0.post1" in p.stderr
    assert [d.name for d in site.glob("*.dist-info")] == ["demo_lib-1.0.dist-info"]
    # the target is not on PYTHONPATH, where another copy is: python3 would import that one
    shadow = tmp_path / "shadow"
    assert _install(str(w2), tmp_path, str(site), VERSIONS_PIP_TARGET=str(shadow)).returncode == 1
    p = _install(str(w1), tmp_path, f"{site}:{shadow}", VERSIONS_PIP_TARGET=str(shadow))
    assert p.returncode == 1
    assert f"python3 finds 1.0 in {site.resolve()}, not in {shadow.resolve()}" in p.stderr
    # NAME==VERSION that pip cannot find fails the step; an empty folder is a usage error
    assert _install("demo-lib==3.0", tmp_path, str(site), **env).returncode == 1
    (tmp_path / "empty").mkdir()
    p = _install(str(tmp_path / "empty"), tmp_path, str(site), **env)
    assert p.returncode == 2 and "no *.whl in" in p.stderr
