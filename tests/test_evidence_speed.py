"""The speed plan (scripts/evidence/speed.sh): its lanes, their GPUs and cores, and its options, as the
steps it would run (EVIDENCE_DRY_RUN=1)."""

from __future__ import annotations

import os
import subprocess

from tests.test_evidence_scripts import EVIDENCE, _plan


def test_speed_plan_runs_its_lanes_on_their_own_gpus_and_cores(tmp_path):
    """The sweep on the first GPU after its warm-up, the fresh box's main job on the second with its own
    HOME (empty JIT caches) and 16 cores, then again on what it built, the timers on the third; disjoint
    core sets."""
    from dskbench.frontends.cli import build_parser

    cmds, lines = _plan("speed.sh", tmp_path / "o", EVIDENCE_GPUS="3", EVIDENCE_CORES="64")
    names = [ln.split()[1] for ln in lines]
    assert names == ["warm", "sweep", "stats", "main-job", "main-job-again", "timers"]
    gpu_of = {ln.split()[1]: ln.split("CUDA_VISIBLE_DEVICES=")[1].split("]")[0] for ln in lines}
    assert gpu_of == {
        "warm": "0",
        "sweep": "0",
        "stats": "0",
        "main-job": "1",
        "main-job-again": "1",
        "timers": "2",
    }
    cores = {}
    for name, cmd in zip(names, cmds, strict=True):
        if cmd[0] == "env":
            assert cmd[1] == f"HOME={tmp_path / 'o' / 'fresh' / 'home'}"
            cmd = cmd[2:]
        if cmd[0] == "taskset":
            lo, hi = map(int, cmd[2].split("-"))
            cores[name] = set(range(lo, hi + 1))
            cmd = cmd[3:]
        if cmd[:3] == ["python3", "-m", "dskbench"]:
            build_parser().parse_args(cmd[3:])
    assert len(cores["main-job"]) == 16
    assert not (cores["main-job"] & cores["sweep"]) and not (cores["timers"] & cores["sweep"])
    # a box of one GPU and 16 cores: the fresh lane alone, on that GPU, on every core
    cmds, lines = _plan("speed.sh", tmp_path / "one", EVIDENCE_GPUS="1", EVIDENCE_CORES="16")
    assert [ln.split()[1] for ln in lines] == ["main-job", "main-job-again"]
    assert all("[CUDA_VISIBLE_DEVICES=0]" in ln for ln in lines)
    assert all("taskset" not in cmd for cmd in cmds)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = subprocess.run(
        ["bash", str(EVIDENCE / "speed.sh"), str(tmp_path / "x")],
        env={**env, "EVIDENCE_GPUS": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "speed.sh: needs a GPU" in p.stderr


def test_speed_plan_defers_the_longest_builds_and_runs_the_sweep_lane_alone(tmp_path):
    """By default the sweep lane's warm-up leaves out the builds recorded at 900 s or more and its sweep
    records their cases skipped (never building them inside the measured run); DEFER_BUILDS_S=0 builds
    everything. SPEED_LANES=sweep: that lane alone, its warm-up on every GPU and core of the job, its sweep
    on the first GPU, then (two GPUs or more, unless SWEEP_ALL=0) the same sweep over all of them; another
    value is refused in one line."""
    from dskbench.frontends.cli import build_parser

    cmds, lines = _plan(
        "speed.sh", tmp_path / "a", EVIDENCE_GPUS="2", EVIDENCE_CORES="32", SPEED_LANES="sweep"
    )
    assert [ln.split()[1] for ln in lines] == ["warm", "sweep", "stats", "sweep-all", "stats-all"]
    warm, sweep, sweep_all = cmds[0], cmds[1], cmds[3]
    assert "CUDA_VISIBLE_DEVICES" not in lines[0] and "[CUDA_VISIBLE_DEVICES=0]" in lines[1]
    assert "[CUDA_VISIBLE_DEVICES=0,1]" in lines[3]
    assert all("taskset" not in c for c in cmds)
    assert warm[warm.index("--defer-builds-over") + 1] == "900"
    assert "--build-ahead" in sweep and sweep[sweep.index("--defer-builds-over") + 1] == "900"
    assert sweep_all[sweep_all.index("--gpus") + 1] == "all" and "--gpus" not in sweep
    assert sweep_all[sweep_all.index("--out") + 1] != sweep[sweep.index("--out") + 1]
    for c in (warm, sweep, sweep_all):
        build_parser().parse_args(c[3:])
    _, lines = _plan("speed.sh", tmp_path / "d", EVIDENCE_GPUS="2", SPEED_LANES="sweep", SWEEP_ALL="0")
    assert [ln.split()[1] for ln in lines] == ["warm", "sweep", "stats"]
    assert "--import" not in warm
    cmds, _ = _plan(
        "speed.sh", tmp_path / "c", EVIDENCE_GPUS="1", SPEED_LANES="sweep", JIT_CACHE="/x/fleet.tgz"
    )
    assert cmds[0][cmds[0].index("--import") + 1] == "/x/fleet.tgz"  # a fleet's archive first, then the rest
    build_parser().parse_args(cmds[0][3:])
    cmds, lines = _plan(
        "speed.sh", tmp_path / "b", EVIDENCE_GPUS="3", EVIDENCE_CORES="64", DEFER_BUILDS_S="0"
    )
    named = dict(zip([ln.split()[1] for ln in lines], cmds, strict=True))
    assert not any(
        "--defer-builds-over" in c or "--build-ahead" in c for c in (named["warm"], named["sweep"])
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = subprocess.run(
        ["bash", str(EVIDENCE / "speed.sh"), str(tmp_path / "x")],
        env={**env, "EVIDENCE_GPUS": "1", "SPEED_LANES": "fresh"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "speed.sh: SPEED_LANES=fresh: expected sweep (or unset: every lane the GPUs allow)"
    ]
