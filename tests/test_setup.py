"""Set-up on a GPU box without one: the pinned-stack check, the driver/CUDA/torch mismatch line, GPU
detection through a fake nvidia-smi, the expected-time line, and scripts/run.sh's steps in order
(DSKBENCH_DRY_RUN=1, a fake python3 for the stack check: nothing is installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import setuptools

from dskbench.setup import mainjob, stack

ROOT = Path(__file__).resolve().parents[1]
PINS = {"torch": "2.11.0", "sglang-kernel": "0.4.5", "flashinfer-python": "0.6.14", "sglang": "0.5.16"}


def test_pins_come_from_pyprojects_gpu_extra():
    assert stack.pinned() == PINS


def test_stack_matches_with_a_cuda_build_label():
    have = {**PINS, "torch": "2.11.0+cu130"}
    assert stack.stack_problems(PINS, have) == []


def test_stack_names_each_package_that_differs_or_is_missing():
    have = {**PINS, "torch": "2.13.0+cpu", "sglang": None}
    assert stack.stack_problems(PINS, have) == [
        "torch: 2.13.0+cpu installed, the gpu extra pins 2.11.0",
        "sglang: not installed (the gpu extra pins 0.5.16)",
    ]


def test_installed_versions_of_present_and_absent_packages():
    found = stack.installed(("pytest", "no-such-package-dskbench"))
    assert found["pytest"] == pytest.__version__
    assert found["no-such-package-dskbench"] is None


def _runner(outputs: dict[str, str | None]):
    return lambda cmd: outputs.get(" ".join(cmd))


def test_gpu_names_and_driver_cuda_from_nvidia_smi():
    run = _runner(
        {
            "nvidia-smi -L": "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 (UUID: GPU-2)\n",
            "nvidia-smi": "| NVIDIA-SMI 550.54  Driver Version: 550.54  CUDA Version: 12.4 |",
        }
    )
    assert len(stack.gpu_names(run)) == 2
    assert stack.driver_cuda(run) == "12.4"
    assert stack.gpu_names(_runner({})) == [] and stack.driver_cuda(_runner({})) is None


GPUS = ["GPU 0: NVIDIA H100"]


def test_no_mismatch_without_gpu_or_when_torch_uses_it():
    assert stack.cuda_problem([], None, "2.11.0+cpu", None, False) is None
    assert stack.cuda_problem(GPUS, "13.0", "2.11.0", "13.0", True) is None


def test_mismatch_torch_built_for_a_newer_cuda_than_the_driver():
    msg = stack.cuda_problem(GPUS, "12.4", "2.11.0+cu130", "13.0", False)
    assert msg == (
        "torch 2.11.0+cu130 is built for CUDA 13.0 but the NVIDIA driver supports CUDA 12.4 at most: "
        "update the driver, or install a torch built for CUDA 12"
    )


def test_mismatch_cpu_build_missing_torch_and_other_causes():
    assert "CPU-only build" in stack.cuda_problem(GPUS, "12.4", "2.13.0+cpu", None, False)
    assert "torch is not installed" in stack.cuda_problem(GPUS, "12.4", None, None, False)
    other = stack.cuda_problem(GPUS, "12.8", "2.11.0", "12.6", False)
    assert "cannot use them" in other and "CUDA_VISIBLE_DEVICES" in other
    for msg in (other, stack.cuda_problem(GPUS, "12.4", "2.11.0", "13.0", False)):
        assert "\n" not in msg


def _fake_bin(tmp_path: Path, gpu: bool, stack_rc: int) -> Path:
    """nvidia-smi listing one GPU (or failing), and python3 answering the stack check with stack_rc."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    smi = bin_ / "nvidia-smi"
    if gpu:
        smi.write_text(
            "#!/bin/sh\n[ \"$1\" = -L ] && echo 'GPU 0: NVIDIA H100 (UUID: GPU-1)' && exit 0\n"
            "[ \"$1\" = --query-gpu=index,name ] && echo '0, NVIDIA H100' && exit 0\n"
            "echo 'Driver Version: 550.54  CUDA Version: 12.4'\n"
        )
    else:
        smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    py = bin_ / "python3"
    py.write_text(
        f'#!/bin/sh\nif [ "$1 $2 $3" = "-m dskbench.setup.stack check" ]; then exit {stack_rc}; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    for f in (smi, py):
        f.chmod(0o755)
    return bin_


def test_gpu_detection_through_nvidia_smi_on_path(tmp_path):
    for gpu, rc in ((True, 0), (False, 1)):
        bin_ = _fake_bin(tmp_path / str(gpu), gpu, 1)
        env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
        got = subprocess.run(
            [sys.executable, "-m", "dskbench.setup.stack", "gpu"], cwd=ROOT, env=env, check=False
        )
        assert got.returncode == rc


def _checkout(tmp_path: Path) -> Path:
    """A copy of what scripts/run.sh reads (its scripts, pyproject.toml, the package as a link)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "run.sh"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    (repo / "dskbench").symlink_to(ROOT / "dskbench")
    return repo


def _dry_run(tmp_path: Path, gpu: bool, stack_rc: int, *args: str, **env: str) -> list[str]:
    """scripts/run.sh in a copy of the checkout, printing its steps; the lines that are steps."""
    repo = _checkout(tmp_path)
    bin_ = _fake_bin(tmp_path, gpu, stack_rc)
    full_env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "DSKBENCH_DRY_RUN": "1", **env}
    full_env.pop("DSKBENCH_USE_SYSTEM_PYTHON", None) if "DSKBENCH_USE_SYSTEM_PYTHON" not in env else None
    full_env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        ["bash", "scripts/run.sh", *args], cwd=repo, env=full_env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def _index(steps: list[str], part: str) -> int:
    return next(i for i, s in enumerate(steps) if part in s)


def test_run_sh_on_cpu_installs_the_cpu_stack_and_builds_nothing_ahead(tmp_path):
    steps = _dry_run(tmp_path, False, 1, "--kernel", "rmsnorm")
    assert steps[0] == "python3 -m venv .venv"
    assert any(s.startswith("python3 -m pip install -q torch==") for s in steps)
    assert "python3 -m pip install -q -e .[test]" in steps
    assert not any("gpu" in s or "build-ahead" in s or "dskbench.setup.stack cuda" in s for s in steps)
    order = [
        _index(steps, p) for p in ("registry generate --check", "dskbench run --quick", "dskbench report")
    ]
    assert order == sorted(order)
    assert "--kernel rmsnorm" in steps[order[1]]


def test_run_sh_on_a_gpu_box_installs_the_gpu_extra_then_checks_estimates_runs_building_ahead(tmp_path):
    steps = _dry_run(tmp_path, True, 1, "--sweep", "decode")
    assert "python3 -m pip install -q -e .[gpu]" in steps and "python3 -m pip install -q -e .[test]" in steps
    assert not any("torch==" in s for s in steps)
    parts = (
        "pip install -q -e .[gpu]",
        "registry generate --check",
        "dskbench.setup.stack cuda",
        "mainjob eta",
        # the JIT builds run beside the measuring; those recorded past 15 minutes are left to warm
        "dskbench run --quick --build-ahead --defer-builds-over 900 --out",
        "dskbench report",
    )
    order = [_index(steps, p) for p in parts]
    assert order == sorted(order)
    assert re.match(
        r"python3 -m dskbench.setup.mainjob times --status 0 --box \S+ --out out/report-", steps[-1]
    )


def test_run_sh_defer_limit_is_the_users_and_zero_makes_every_build(tmp_path):
    steps = _dry_run(tmp_path / "a", True, 1, DSKBENCH_DEFER_BUILDS_S="1200")
    assert any("dskbench run --quick --build-ahead --defer-builds-over 1200 --out" in s for s in steps)
    steps = _dry_run(tmp_path / "b", True, 1, DSKBENCH_DEFER_BUILDS_S="0")
    assert any("dskbench run --quick --build-ahead --out" in s for s in steps)
    assert not any("--defer-builds-over" in s for s in steps)


def test_run_sh_offline_installs_only_the_gpu_extra(tmp_path):
    steps = _dry_run(tmp_path, True, 1, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    assert [s for s in steps if "pip install" in s] == ["python3 -m pip install -q -e .[gpu]"]


def test_run_sh_uses_a_python_that_has_the_pinned_stack(tmp_path):
    steps = _dry_run(tmp_path, True, 0)
    assert steps[0] == "python3 -m pip install -q --no-deps --no-build-isolation -e ."
    assert not any("venv" in s or "[gpu" in s for s in steps)
    assert _index(steps, "mainjob eta") < _index(steps, "dskbench run --quick --build-ahead")


def test_use_system_python_still_forces_this_python(tmp_path):
    steps = _dry_run(tmp_path, False, 1, DSKBENCH_USE_SYSTEM_PYTHON="1")
    assert steps[0] == "python3 -m pip install -q --no-deps --no-build-isolation -e ."
    assert not any("venv" in s for s in steps)


def test_system_python_install_needs_no_index(tmp_path):
    """The command setup.sh runs for DSKBENCH_USE_SYSTEM_PYTHON, with pip barred from any index."""
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "dskbench", proj / "dskbench", ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # an inherited PYTHONPATH (a checkout run without installing) would shadow the install under test
    outer = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = {**outer, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "empty")}
    # this Python's own build tools are the test run's (setuptools>=68 as pyproject asks), not venv's old copy
    subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], env=env, check=False)
    site = next((env_dir / "lib").glob("python3*/site-packages"))
    (site / "outer.pth").write_text(str(Path(setuptools.__file__).parents[1]) + "\n")
    tools = subprocess.run(
        [py, "-m", "dskbench.setup.stack", "tools"], cwd=proj, capture_output=True, text=True
    )
    assert tools.returncode == 0, tools.stderr
    cmd = [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."]
    proc = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    got = subprocess.run(
        [py, "-c", "import dskbench; print(dskbench.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert got.stdout.strip() == str(proj / "dskbench" / "__init__.py")


def test_build_tools_problems():
    assert stack.build_tools_problem("80.9.0", False) is None
    assert stack.build_tools_problem("69.5.1", True) is None
    assert "needs the wheel package" in stack.build_tools_problem("69.5.1", False)
    assert "needs setuptools>=68" in stack.build_tools_problem("65.5.0", True)
    assert "no setuptools" in stack.build_tools_problem(None, True)


def test_estimate_from_a_plain_plan_and_from_shards():
    plain = "k.a  b\nk.b  b\n100 cases to run, 3 kernels skipped at planning\n"
    assert mainjob.estimate(plain, 0.8) == (
        "expected: about 80 s to measure 100 cases (0.8 s per case by the cost model; "
        "on a fresh box the longest JIT build may take longer)"
    )
    sharded = (
        plain.replace("100", "900")
        + "GPU 0: 450 cases, ~300 s estimated: a\nGPU 1: 450 cases, ~420 s estimated: b\n"
    )
    assert mainjob.estimate(sharded, 0.8).startswith(
        "expected: about 7 min to measure 900 cases (the longest of 2"
    )
    assert mainjob.estimate("nothing planned", 0.8) is None
    # one H200 measured 0.054 s of item time per ok case on the quick sweep (results/h200-2026-11-27b/)
    assert 0.02 <= mainjob.per_case_s() <= 0.1
    assert "(0.045 s per case by the cost model" in mainjob.estimate(plain, 0.045)


def test_a_fresh_box_is_told_its_builds_set_the_length_naming_the_longest_kept():
    plan = (
        "cutlass_fused_moe/experts:bf16/decode/T=1,tp=1  flashinfer.bf16\n"
        "cutlass_scaled_fp4_mm/gate_up/decode/T=1  sglang_jit.marlin\n"
        "rmsnorm/q_a_layernorm/decode/T=1  sglang_jit\n"
        "fake_kernel  skipped: not in this model\n"
        "3 cases to run, 1 kernels skipped at planning\n"
    )
    times = {
        ("cutlass_fused_moe", "flashinfer.bf16"): 1380.0,
        ("cutlass_scaled_fp4_mm", "sglang_jit.marlin"): 803.0,
        ("top_k_renorm_prob", "flashinfer"): 900.0,  # not in the plan
    }
    assert mainjob.fresh_box_note(plan, 900.0, times) == (
        "this box's JIT caches are empty: its builds, beside the measuring, set the length; the longest, "
        "cutlass_scaled_fp4_mm · sglang_jit.marlin, took 13 min where recorded"
    )  # the fused MoE's build is deferred
    assert "cutlass_fused_moe · flashinfer.bf16, took 23 min" in mainjob.fresh_box_note(plan, None, times)
    assert mainjob.fresh_box_note(plan, 900.0, {}) == (
        "this box's JIT caches are empty: its builds run beside the measuring"
    )
    assert mainjob._defer_s(["--build-ahead", "--defer-builds-over", "900"]) == 900.0
    assert mainjob._defer_s(["--build-ahead"]) is None


@pytest.mark.parametrize("fresh", [True, False])
def test_eta_adds_the_build_line_only_on_a_fresh_box(monkeypatch, capsys, fresh):
    import io

    monkeypatch.setattr(mainjob, "_fresh", lambda: fresh)
    monkeypatch.setattr(
        "sys.stdin", io.StringIO("rmsnorm/q_a/decode/T=1  sglang_jit\n1 cases to run, 0 kernels\n")
    )
    assert mainjob.main(["eta", "--build-ahead", "--defer-builds-over", "900"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("expected: about ")
    assert (len(lines) == 2 and lines[1].startswith("this box's JIT caches are empty")) == fresh
    assert len(lines) == (2 if fresh else 1)


# -- the main job's wall time per stage -------------------------------------------------------------------

STAGE_KEYS = ["setup", "measure", "report"]


def test_dry_run_ends_with_the_stage_times_step(tmp_path):
    last = _dry_run(tmp_path, False, 1)[-1].split()
    assert last[:6] == ["python3", "-m", "dskbench.setup.mainjob", "times", "--status", "0"]
    assert last[6] == "--box"  # the box's facts, read at the start
    assert last[8] == "--out" and re.fullmatch(r"out/report-\d{8}T\d{6}Z/main_job\.json", last[9])
    assert [a.split("=")[0] for a in last[10:]] == STAGE_KEYS
    assert all(a.split("=")[1].isdigit() for a in last[10:])


def _stub_bin(tmp_path: Path, gpu: bool, run_rc: int) -> Path:
    """_fake_bin's nvidia-smi, and a python3 that installs nothing and stubs every `dskbench` command
    (logging it; `report ... --out DIR` makes DIR; `run` exits run_rc); the rest runs for real."""
    bin_ = _fake_bin(tmp_path, gpu, 0)
    (bin_ / "python3").write_text(
        "#!/bin/sh\n"
        'case "$1 $2 $3" in "-m dskbench.setup.stack check"|"-m dskbench.setup.stack tools"'
        '|"-m dskbench.setup.stack cuda") exit 0;; esac\n'
        '[ "$1 $2" = "-m pip" ] && exit 0\n'
        'if [ "$1 $2" = "-m dskbench" ]; then\n'
        f'  echo "$*" >> {tmp_path / "calls.log"}\n'
        '  [ "$3" = report ] && mkdir -p "$6"\n'
        '  [ "$3 $4" = "run --dry-run" ] && echo "3 cases to run" && exit 0\n'
        f'  [ "$3" = run ] && exit {run_rc}\n'
        "  exit 0\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    return bin_


def _main_job(tmp_path: Path, gpu: bool, run_rc: int) -> tuple[subprocess.CompletedProcess, Path]:
    repo = _checkout(tmp_path)
    bin_ = _stub_bin(tmp_path, gpu, run_rc)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "DSKBENCH_USE_SYSTEM_PYTHON": "1"}
    env.pop("DSKBENCH_DRY_RUN", None)
    proc = subprocess.run(["bash", "scripts/run.sh"], cwd=repo, env=env, capture_output=True, text=True)
    return proc, repo


def _times_line(stderr: str) -> dict[str, int]:
    line = stderr.strip().splitlines()[-1]
    m = re.fullmatch(
        r"main job: set-up (\d+) s, measuring (\d+) s, report (\d+) s; "
        r"total (\d+) s; exit status (\d+)",
        line,
    )
    assert m, line
    got = dict(zip([*STAGE_KEYS, "total", "exit"], map(int, m.groups()), strict=True))
    assert got["total"] == sum(got[k] for k in STAGE_KEYS)
    return got


@pytest.mark.parametrize("gpu", [False, True])
def test_main_job_prints_and_writes_its_stage_times(tmp_path, gpu):
    proc, repo = _main_job(tmp_path, gpu, 0)
    assert proc.returncode == 0, proc.stderr
    assert _times_line(proc.stderr)["exit"] == 0
    (report,) = (repo / "out").glob("report-*")
    doc = json.loads((report / "main_job.json").read_text())
    assert list(doc["seconds"]) == STAGE_KEYS
    assert all(isinstance(v, int) and v >= 0 for v in doc["seconds"].values())
    assert doc["total_s"] == sum(doc["seconds"].values()) and doc["exit_status"] == 0
    assert isinstance(doc["fresh"], bool) and doc["cores"] == os.cpu_count()  # the box it ran on
    assert isinstance(doc["gpus"], list) and bool(doc["gpus"]) == gpu
    calls = (tmp_path / "calls.log").read_text()
    assert ("--build-ahead" in calls) == gpu  # JIT builds beside the measuring on a GPU only


def test_main_job_times_carry_its_exit_status(tmp_path):
    proc, repo = _main_job(tmp_path / "wrong", False, 1)  # a case wrong: the report is still made
    assert proc.returncode == 1
    assert _times_line(proc.stderr)["exit"] == 1
    (report,) = (repo / "out").glob("report-*")
    assert json.loads((report / "main_job.json").read_text())["exit_status"] == 1
    proc, repo = _main_job(tmp_path / "stopped", False, 130)  # interrupted: no report, the line still
    assert proc.returncode == 130
    assert _times_line(proc.stderr)["exit"] == 130
    assert not (repo / "out").exists()


def test_stage_times_and_their_record():
    secs = mainjob.stage_times(["measure=12", "setup=3"])
    assert secs == {"setup": 3, "measure": 12, "report": 0}
    assert mainjob.times_record(secs, 1) == {"seconds": secs, "total_s": 15, "exit_status": 1}
    assert mainjob.times_line(secs, 0) == (
        "main job: set-up 3 s, measuring 12 s, report 0 s; total 15 s; exit status 0"
    )
    for bad in (["setup"], ["warm=3"], ["setup=-1"]):
        with pytest.raises(ValueError):
            mainjob.stage_times(bad)


def test_run_outputs_under_results_are_ignored_and_the_evidence_folders_are_not():
    """A run leaves `git status` clean (its results, asv's and pytest-benchmark's outputs, the report),
    while a folder of committed evidence under results/ stays visible to git."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a checkout")

    def ignored(path: str) -> bool:
        got = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, check=False)
        assert got.returncode in (0, 1), path
        return got.returncode == 0

    for path in (
        "results/run-20270101T000000Z.jsonl",
        "results/run-cpu-20270101T000000Z.jsonl",
        "results/asv/gpu-box/0123abcd-existing-py.json",
        "results/asv-html/index.html",
        "results/asv-jsonl/host/rmsnorm.jsonl",
        "results/pytest-jsonl/rmsnorm.jsonl",
        "out/report-20270101T000000Z/index.html",
    ):
        assert ignored(path), path
    for path in (
        "results/README.md",
        "results/h100-2026-11-24/README.md",
        "results/h100-2027-01-01/sweep.jsonl.gz",
    ):
        assert not ignored(path), path
