"""dskbench works installed, without a checkout: the wheel carries the shapes files and the registry, and
`dskbench list` and a CPU `run` work from another folder with only the wheel importable. And where
dskbench.paths finds its data (package, checkout, DSKBENCH_ROOT)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from dskbench import paths

REPO = Path(__file__).resolve().parent.parent


def _offline_wheel_reason() -> str | None:
    """Why `pip wheel --no-build-isolation` cannot build here (None when it can): it needs setuptools,
    with bdist_wheel built in (setuptools >= 70.1) or the `wheel` package."""
    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed: the wheel cannot be built without network"
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:
        return f"setuptools {setuptools.__version__} needs the `wheel` package to build a wheel offline"
    return None


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(a bare interpreter with only the unpacked wheel and the dependencies importable, its env)."""
    reason = _offline_wheel_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy, so the build writes nothing into the checkout (build/, *.egg-info)
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(REPO / name, src / name)
    shutil.copytree(REPO / "dskbench", src / "dskbench", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSKBENCH_", "PYTHON"))}
    r = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
        ],
        src,
        {**env, "PIP_NO_INDEX": "1"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp / "dist").glob("dskbench-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    # A fresh interpreter: the test venv's site-packages come in through PYTHONPATH only, so its .pth
    # files (the editable install pointing at the checkout) are never run, here or in run's workers.
    venv.create(tmp / "venv", with_pip=False)
    python = tmp / "venv" / "bin" / "python"
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env["PYTHONPATH"] = os.pathsep.join([str(site), *deps])
    return python, env


def test_the_wheel_carries_the_shapes_files_the_registry_and_the_peaks(installed, tmp_path):
    python, env = installed
    site = Path(env["PYTHONPATH"].split(os.pathsep)[0])
    data = site / "dskbench" / "data"
    assert (data / "shapes" / "deepseek_r1_nvfp4.yaml").is_file()
    assert (data / "shapes" / "deployment.yaml").is_file()
    shipped = sorted(p.name for p in (data / "registry").glob("*.yaml"))
    assert shipped == sorted(p.name for p in paths.REGISTRY_DIR.glob("*.yaml")) and len(shipped) > 50
    assert (data / "registry" / ".manifest").is_file()
    assert (data / "peaks" / "datasheet.yaml").is_file()  # the denominator of every % of peak
    probe = "import dskbench, dskbench.paths as p\nfor x in (dskbench.__file__, p.REGISTRY_DIR, p.RESULTS_DIR): print(x)"
    r = _run([str(python), "-c", probe], tmp_path, env)
    assert r.returncode == 0, r.stderr
    where, registry, results = r.stdout.splitlines()
    assert Path(where).is_relative_to(site)  # the wheel's copy, not the checkout's
    assert Path(registry) == data / "registry"
    assert Path(results) == tmp_path / "results"  # installed: results/ under the working folder


def test_list_and_a_cpu_run_work_from_another_folder(installed, tmp_path):
    python, env = installed
    r = _run([str(python), "-m", "dskbench", "list"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert "rmsnorm" in r.stdout and "silu_and_mul" in r.stdout
    run = ["run", "--device", "cpu", "--kernel", "rmsnorm", "--sweep", "decode", "--quick"]
    run += ["--op", "input_layernorm", "--point", "T=1", "--budget", "0.05"]
    r = _run([str(python), "-m", "dskbench", *run], tmp_path, env)
    assert r.returncode == 0, r.stdout + r.stderr
    (out,) = (tmp_path / "results").glob("run-cpu-*.jsonl*")
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    results = [x for x in records if x.get("record") == "result"]
    assert [(x["kernel"], x["status"]) for x in results] == [("rmsnorm", "ok")], results


def test_generate_in_an_installed_package_asks_for_traces(installed, tmp_path):
    python, env = installed
    r = _run([str(python), "-m", "dskbench", "registry", "generate"], tmp_path, env)
    assert r.returncode == 2
    assert r.stderr.startswith("dskbench: no trace documents in ") and "--traces" in r.stderr


# -- where dskbench.paths looks ------------------------------------------------------------------------


def _paths_in(env: dict[str, str], cwd: Path) -> dict[str, str]:
    code = "import json, dskbench.paths as p\nprint(json.dumps({k: str(v) for k, v in vars(p).items() if k.isupper()}))"
    r = _run([sys.executable, "-c", code], cwd, {**env, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_checkout_reads_its_top_level_data_and_writes_its_results_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DSKBENCH_ROOT"}
    got = _paths_in(env, tmp_path)
    assert got["SHAPES_FILE"] == str(REPO / "shapes" / "deepseek_r1_nvfp4.yaml")
    assert got["DEPLOYMENT_FILE"] == str(REPO / "shapes" / "deployment.yaml")
    assert got["REGISTRY_DIR"] == str(REPO / "kernels_registry")
    # the package's data is the same files: what a wheel carries is what the checkout reads
    data = REPO / "dskbench" / "data"
    assert (data / "shapes").resolve() == REPO / "shapes" and (
        data / "registry"
    ).resolve() == REPO / "kernels_registry"
    assert got["TRACES_DIR"] == str(REPO / "traces")
    assert got["RESULTS_DIR"] == str(REPO / "results")  # from a checkout: its results/, whatever the cwd


def test_dskbench_root_reads_everything_from_one_folder(tmp_path):
    root = tmp_path / "root"
    got = _paths_in({**os.environ, "DSKBENCH_ROOT": str(root)}, tmp_path)
    assert got["SHAPES_FILE"] == str(root / "shapes" / "deepseek_r1_nvfp4.yaml")
    assert got["DEPLOYMENT_FILE"] == str(root / "shapes" / "deployment.yaml")
    assert got["REGISTRY_DIR"] == str(root / "registry")
    assert got["TRACES_DIR"] == str(root / "traces")
    assert got["RESULTS_DIR"] == str(root / "results")
