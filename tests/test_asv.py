"""The asv front end on the CPU: the machine-file writer (fake NVML), the generated suite as asv_runner
sees it, and `asv check` + `asv run -E existing --quick` on fake kernels through the real asv.conf.json."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dskbench.frontends.asv import machine as asv_machine
from dskbench.frontends.asv.benchmarks import SUITE_VERSION, asv_jsonl_dir
from dskbench.frontends.suite.plan_cache import child_env
from dskbench.results.io import read_runs
from tests.suite_helpers import REPO, make_fake_root

# -- machine file ----------------------------------------------------------------------------------------


class FakeNVML:
    """The pynvml calls asv_machine makes, for two H100s (index 1 has another UUID)."""

    def __init__(self, names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")):
        self.names = names

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetName(self, h):
        return self.names[h].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-abc-{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=85_520_809_984)

    def nvmlSystemGetDriverVersion(self):
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080


def test_read_gpus_with_fake_nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = asv_machine.read_gpus(FakeNVML())
    assert len(gpus) == 2
    assert gpus[0] == {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-abc-0",
        "memory_gb": 85.5,
        "driver": "570.86.15",
        "cuda": "12.8",
    }
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc-1")
    assert [g["uuid"] for g in asv_machine.read_gpus(FakeNVML())] == ["GPU-abc-1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")  # CUDA stops at the first invalid ordinal
    assert [g["uuid"] for g in asv_machine.read_gpus(FakeNVML())] == ["GPU-abc-1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert asv_machine.read_gpus(FakeNVML()) == []


def test_machine_name_separates_gpus_and_hosts():
    assert asv_machine.machine_name("NVIDIA H100 80GB HBM3", "node7.cluster") == "nvidia-h100-80gb-hbm3_node7"
    assert asv_machine.machine_name("NVIDIA H200", "node7") != asv_machine.machine_name(
        "NVIDIA H100", "node7"
    )
    assert asv_machine.machine_name(None, "Box_1") == "cpu_box-1"


def test_machine_file_is_what_asv_loads(tmp_path, monkeypatch, capsys):
    from asv.machine import Machine

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = tmp_path / "asv-machine.json"
    path.write_text(json.dumps({"version": 1, "old-box": {"machine": "old-box", "os": "x"}}))
    assert asv_machine.main(["--path", str(path), "--host", "node7"], lib=FakeNVML()) == 0
    name = capsys.readouterr().out.strip()
    assert name == "nvidia-h100-80gb-hbm3_node7"
    data = json.loads(path.read_text())
    assert set(data) == {"version", "old-box", name}  # other machines are kept
    m = Machine.load(machine_name=name, _path=str(path))
    assert (m.machine, m.gpu, m.gpu_count, m.driver, m.cuda) == (
        name,
        "NVIDIA H100 80GB HBM3",
        "2",
        "570.86.15",
        "12.8",
    )
    assert m.arch and m.cpu and m.num_cpu and m.os and m.ram
    # --print-name writes nothing
    path.unlink()
    asv_machine.main(["--print-name", "--host", "node7"], lib=FakeNVML())
    assert capsys.readouterr().out.strip() == name and not path.exists()


def test_machine_file_without_nvml(tmp_path, capsys):
    class NoNVML:
        def nvmlSystemGetDriverVersion(self):
            raise OSError("NVML Shared Library Not Found")

    asv_machine.main(["--path", str(tmp_path / "m.json"), "--host", "ci"], lib=NoNVML())
    out = capsys.readouterr()
    assert out.out.strip() == "cpu_ci" and "NVML unavailable" in out.err
    assert json.loads((tmp_path / "m.json").read_text())["cpu_ci"]["gpu"] == "none"


# -- the generated suite ---------------------------------------------------------------------------------


def test_jsonl_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("DSKBENCH_ASV_JSONL_DIR", raising=False)
    monkeypatch.delenv("ASV_CONF_DIR", raising=False)
    assert asv_jsonl_dir(tmp_path).parent == tmp_path / "results" / "asv-jsonl"
    monkeypatch.setenv("ASV_CONF_DIR", str(tmp_path / "conf"))
    assert asv_jsonl_dir(tmp_path).parent == tmp_path / "conf" / "results" / "asv-jsonl"
    monkeypatch.setenv("DSKBENCH_ASV_JSONL_DIR", str(tmp_path / "x"))
    assert asv_jsonl_dir(tmp_path) == tmp_path / "x"


@pytest.fixture()
def asv_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_fake_root(tmp_path, monkeypatch)
    monkeypatch.setenv("DSKBENCH_DEVICE", "cpu")
    monkeypatch.setenv("DSKBENCH_ASV_SWEEP", "prefill")  # CPU profile: one point, T=512
    monkeypatch.setenv("DSKBENCH_ASV_BACKENDS", "fake,b200")
    monkeypatch.setenv("DSKBENCH_ASV_BUDGET", "0.02")
    monkeypatch.setenv("DSKBENCH_ASV_JSONL_DIR", str(tmp_path / "jsonl"))
    return root


@pytest.fixture()
def bench_module(asv_env):
    """benchmarks.bench_kernels imported afresh under the fake registry, and forgotten afterwards."""
    sys.modules.pop("benchmarks.bench_kernels", None)
    yield importlib.import_module("benchmarks.bench_kernels")
    sys.modules.pop("benchmarks.bench_kernels", None)


def test_generated_suite_as_asv_runner_sees_it(bench_module):
    from asv_runner.benchmarks._base import get_setup_cache_key
    from asv_runner.discovery import _get_benchmark

    mod = bench_module
    assert "torch" not in mod.__dict__
    classes = {n: c for n, c in vars(mod).items() if isinstance(c, type) and not n.startswith("_")}
    assert set(classes) >= {"fake_ok", "fake_wrong"} and "fake_host" not in classes
    benches = {}
    for cname in ("fake_ok", "fake_wrong"):
        for attr in ("track_latency", "track_bandwidth"):
            b = _get_benchmark(attr, mod, classes[cname], getattr(classes[cname], attr))
            benches[(cname, attr)] = b
    lat = benches[("fake_ok", "track_latency")]
    assert lat.name == "bench_kernels.fake_ok.track_latency" and lat.unit == "seconds"
    assert benches[("fake_ok", "track_bandwidth")].unit == "GB/s"
    assert lat.params == [
        ["'fake_ok/input_layernorm/prefill/T=64|fake'", "'fake_ok/input_layernorm/prefill/T=64|b200'"]
    ]
    assert lat.version == f"dskbench-{SUITE_VERSION}-cold"
    # one setup_cache per kernel (a shared key would hand fake_wrong the measurements of fake_ok)
    keys = {c: get_setup_cache_key(classes[c]().setup_cache) for c in ("fake_ok", "fake_wrong")}
    assert len(set(keys.values())) == 2 and all(k.startswith("bench_kernels:") for k in keys.values())
    assert lat.setup_cache_key == keys["fake_ok"] and lat.setup_cache_timeout >= 180
    assert "kernel 'fake_ok'" in lat.code  # asv can show the generated code

    # setup/track on a hand-made cache: ok, skipped, and no byte count
    inst = classes["fake_ok"]()
    ok = {"status": "ok", "reason": None, "samples_s": [1e-6, 2e-6], "gbps": 5.0}
    cache = {
        "cases": {
            "a|x": ok,
            "b|x": {"status": "skipped", "reason": "needs sm100 (found no CUDA GPU)"},
            "c|x": {**ok, "gbps": None},
        }
    }
    inst.setup(cache, "a|x")
    assert inst.track_latency(cache, "a|x") == {"samples": [1e-6, 2e-6], "number": 1}
    assert inst.track_bandwidth(cache, "a|x") == 5.0
    with pytest.raises(NotImplementedError, match="skipped: needs sm100"):
        inst.setup(cache, "b|x")
    with pytest.raises(NotImplementedError, match="no result"):
        inst.setup(cache, "zzz|x")
    from asv_runner.benchmarks.mark import SkipNotImplemented

    with pytest.raises(SkipNotImplemented):
        inst.track_bandwidth(cache, "c|x")


def test_class_names_are_safe(bench_module):
    mod = bench_module
    taken: set[str] = set()
    assert mod._class_name("BatchMLAPagedAttentionWrapper", taken) == "BatchMLAPagedAttentionWrapper"
    assert mod._class_name("shared_head.norm", taken) == "shared_head_norm"
    assert mod._class_name("shared_head-norm", taken) == "shared_head_norm_2"
    assert mod._class_name("setup", taken) == "k_setup"  # asv would call a module-level `setup`
    assert mod._class_name("2fast", taken) == "k_2fast"


# -- asv itself ------------------------------------------------------------------------------------------


def _asv(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "asv", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_asv_check_and_quick_run_on_cpu(asv_env, tmp_path):
    from asv import util

    conf = util.load_json(str(REPO / "asv.conf.json"), js_comments=True)  # the real file parses
    branch = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    conf.update(
        branches=[branch] if branch not in ("", "HEAD") else conf["branches"],  # publish walks HEAD's branch
        repo=str(REPO),
        benchmark_dir=str(REPO / "benchmarks"),
        results_dir=str(tmp_path / "results" / "asv"),
        html_dir=str(tmp_path / "html"),
        env_dir=str(tmp_path / "env"),
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "asv.conf.json").write_text(json.dumps(conf))
    env = child_env()
    env.update(HOME=str(tmp_path), ASV_PYTHONPATH=str(REPO))  # asv drops PYTHONPATH; HOME: machine file
    machine = subprocess.run(
        [sys.executable, "-m", "dskbench.frontends.asv.machine"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    p = _asv(["check", "-E", f"existing:{sys.executable}"], work, env)
    assert p.returncode == 0 and "No problems found" in p.stdout, p.stdout + p.stderr

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    run = ["run", "--machine", machine, "-E", f"existing:{sys.executable}", "--quick", "--record-samples"]
    p = _asv([*run, "--set-commit-hash", head, "--show-stderr"], work, env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]

    results_dir = tmp_path / "results" / "asv" / machine
    assert json.loads((results_dir / "machine.json").read_text())["gpu"] == "none"
    (res_file,) = [f for f in results_dir.glob(f"{head[:8]}-*.json")]
    res = json.loads(res_file.read_text())
    cols = res["result_columns"]

    def get(bench: str) -> dict:
        return dict(zip(cols, res["results"][f"bench_kernels.{bench}"], strict=False))

    lat = get("fake_ok.track_latency")
    params = [p.strip("'") for p in lat["params"][0]]
    by_case = dict(zip(params, lat["result"], strict=True))
    ok_key, gpu_key = (
        "fake_ok/input_layernorm/prefill/T=64|fake",
        "fake_ok/input_layernorm/prefill/T=64|b200",
    )
    assert by_case[gpu_key] is None or math.isnan(by_case[gpu_key])  # skipped on CPU -> n/a
    assert get("fake_wrong.track_latency")["result"] == [None] or math.isnan(
        get("fake_wrong.track_latency")["result"][0]
    )
    bw = dict(zip(params, get("fake_ok.track_bandwidth")["result"], strict=True))[ok_key]
    assert bw > 0

    # asv's statistics are computed from the core's samples, kept in our JSON lines
    (kept,) = (tmp_path / "jsonl").glob("*-fake_ok.jsonl")
    (jrun,) = read_runs([kept])
    rec = next(r for r in jrun.results if f"{r['case_id']}|{r['backend']['name']}" == ok_key)
    ours = [x * 1e-6 for x in rec["timing"]["samples_us"]]
    asv_samples = dict(zip(params, lat["samples"], strict=True))[ok_key]
    assert asv_samples == pytest.approx(ours, rel=1e-4)  # asv stores them rounded
    assert by_case[ok_key] == pytest.approx(statistics.median(ours), rel=1e-3)
    assert {r["status"] for r in jrun.results} == {"ok", "skipped"}
    assert any("needs sm100" in (r.get("reason") or "") for r in jrun.results)

    # publishing reads the regression settings and writes the site
    p = _asv(["publish"], work, env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert (tmp_path / "html" / "index.json").is_file()
    assert os.path.isdir(tmp_path / "html" / "graphs")
    # ...and the site works offline: every CDN script/stylesheet asv names has a vendored copy
    from dskbench.frontends.asv.offline import main as offline

    assert offline([str(tmp_path / "html")]) == 0
    page = (tmp_path / "html" / "index.html").read_text()
    assert not re.search(r'<(script|link)[^>]*(src|href)="https?://', page)
    assert 'src="vendor/jquery-3.3.1.min.js"' in page and "integrity=" not in page
    assert (tmp_path / "html" / "vendor" / "jquery.flot-0.8.3.js").is_file()


def test_asv_offline_leaves_unknown_resources_and_says_so(tmp_path, capsys):
    from dskbench.frontends.asv.offline import main as offline

    assert offline([str(tmp_path)]) == 2  # nothing published there
    assert "run `asv publish` first" in capsys.readouterr().err
    (tmp_path / "index.html").write_text(
        '<script src="https://code.jquery.com/jquery-3.3.1.min.js" integrity="sha384-x" crossorigin="anonymous">'
        '</script><script src="https://cdn.example/new.js"></script><a href="https://github.com/x">x</a>'
    )
    assert offline([str(tmp_path)]) == 1  # a resource without a copy: the site still needs network
    page = (tmp_path / "index.html").read_text()
    assert '<script src="vendor/jquery-3.3.1.min.js">' in page
    assert 'src="https://cdn.example/new.js"' in page and 'href="https://github.com/x"' in page
    assert "(no vendored copy): https://cdn.example/new.js" in capsys.readouterr().err


def test_asv_at_two_commits_from_clones_of_the_checkout(tmp_path):
    """scripts/evidence/asv_two_commits.sh, as on a GPU box but on the CPU: each commit measured from its
    own clone (the checkout left as it was), dskbench run over the same cases, the site published."""
    has_parent = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD~1"], cwd=REPO, capture_output=True
    )
    if has_parent.returncode != 0:
        pytest.skip("this checkout has no HEAD~1 (a shallow clone of depth 1)")
    commits = subprocess.run(
        ["git", "rev-parse", "HEAD~1", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    dest = tmp_path / "out"
    env = child_env()
    env.update(
        HOME=str(tmp_path),
        ASV_PYTHON=sys.executable,
        ASV_WORK=str(tmp_path / "work"),
        DSKBENCH_ASV_KERNELS="rmsnorm",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    p = subprocess.run(
        ["bash", "scripts/evidence/asv_two_commits.sh", str(dest)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (dest / "asv.log").read_text()
    assert p.returncode == 0 and all(f"asv run {c} rc=0" in log for c in commits), log[-3000:]
    (machine,) = [d for d in (dest / "asv").iterdir() if d.is_dir()]
    recorded = sorted(f.name[:8] for f in machine.glob("*-existing-*.json"))
    assert recorded == sorted(c[:8] for c in commits)
    assert read_runs([dest / "same-as-asv.jsonl"])[0].results  # the same cases through dskbench run
    assert "asv publish rc=0" in log and (dest / "asv-html" / "index.html").exists()
    assert "cdn" not in (dest / "asv-html" / "index.html").read_text().lower()  # served from vendor/
    now = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    assert now == status  # the checkout itself was not touched


def test_asv_two_commits_refuses_what_is_not_a_commit(tmp_path):
    p = subprocess.run(
        ["bash", "scripts/evidence/asv_two_commits.sh", str(tmp_path / "o"), "no-such-ref", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "no-such-ref or HEAD is not a commit" in p.stderr
    assert not (tmp_path / "o").exists()
