"""The environment a communication benchmark's rank needs, set before torch, NCCL or sglang read it:
NVLink multicast off when DSKBENCH_NO_MULTICAST asks (GPUs shared with other tenants), sglang's own P2P
check left to the driver's answer, and CUDA_VISIBLE_DEVICES as indices where it names GPU UUIDs."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

from dskbench.device.visible import visible_devices
from dskbench.results.environment import NO_MULTICAST_ENV, no_multicast_asked


def prepare_rank_environment(environ: MutableMapping[str, str] | None = None) -> None:
    """Set what every rank (and the driver, whose torchruns inherit it) needs before torch is imported.

    DSKBENCH_NO_MULTICAST=1: NVLink multicast off in every rank (NO_MULTICAST_ENV, as `dskbench run
    --no-multicast` sets it; the environment record says which); else as the host has it. sglang's custom
    all-reduce set-up runs a P2P test that needs sglang's own world group (not initialised here: it
    asserts); SGLANG_SKIP_P2P_CHECK=1 makes it trust torch.cuda.can_device_access_peer
    (dskbench/adapters/comm/rank.py)."""
    environ = os.environ if environ is None else environ
    if no_multicast_asked(environ):
        environ.update(NO_MULTICAST_ENV)
    environ.setdefault("SGLANG_SKIP_P2P_CHECK", "1")
    numeric_visible_devices(environ)


def numeric_visible_devices(environ: Any, uuid_index: Any = None) -> str | None:
    """CUDA_VISIBLE_DEVICES given as GPU UUIDs rewritten as NVML indices (with CUDA_DEVICE_ORDER=PCI_BUS_ID,
    which numbers devices as NVML does), before CUDA reads it: sglang's custom all-reduce parses the
    variable as integers (custom_all_reduce_utils) and would fail its set-up on UUIDs. Returns the new
    value, or None when nothing was changed (unset, already numeric, mixed, MIG, or a lookup failed)."""
    tokens = visible_devices(environ) or []
    if not tokens or not all(t.startswith("GPU-") for t in tokens):
        return None
    if environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID":
        return None
    try:
        value = ",".join(str((uuid_index or _nvml_uuid_index)(t)) for t in tokens)
    except Exception:  # noqa: BLE001 - leave the variable as it is; sglang says why it cannot use it
        return None
    environ["CUDA_VISIBLE_DEVICES"] = value
    environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return value


def _nvml_uuid_index(token: str) -> int:
    """NVML index (PCI bus order) of the GPU whose UUID starts with `token`."""
    import pynvml

    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(token):
                return i
    finally:
        pynvml.nvmlShutdown()
    raise LookupError(f"no GPU with UUID {token}")
