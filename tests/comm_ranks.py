"""Gloo ranks for the communication tests: a command run as n processes with the variables torchrun sets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMM = [sys.executable, "-m", "dskbench", "comm"]  # the command each rank runs, as torchrun starts it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(cmd: list[str], n: int = 2, timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Run cmd as n gloo ranks (the variables torchrun sets), in parallel."""
    port = str(free_port())
    procs = []
    for r in range(n):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(n)}
        env.update(RANK=str(r), LOCAL_RANK=str(r), PYTHONPATH=str(REPO))
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr))
    return out
