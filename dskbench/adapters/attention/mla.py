"""What DeepSeek-R1's attention kernels share: SGLang's softmax scale and the backends' shared workspaces.

Softmax scale: SGLang's ``layer.scaling`` for DeepSeek-R1, Dq^-0.5 (Dq = 192, the q/k head dim) times the
YaRN mscale^2 (``compute_mla_mscale_scaling``: factor 40, mscale_all_dim 1 -> (0.1 ln 40 + 1)^2 = 1.874),
0.1352.
"""

from __future__ import annotations

import math

import torch

from dskbench.shapes.cases import Case

ROPE_SCALING_FACTOR = 40.0  # DeepSeek-R1 config.json rope_scaling (yarn): factor 40, mscale_all_dim 1.0
MSCALE_ALL_DIM = 1.0
FLASHINFER_MLA_WORKSPACE_BYTES = 384 * 1024 * 1024  # SGLANG_FLASHINFER_WORKSPACE_SIZE default
TRTLLM_MLA_WORKSPACE_BYTES = 150 * 1024 * 1024  # trtllm_mla_backend DEFAULT_WORKSPACE_SIZE_MB


def mla_softmax_scale(head_dim: int) -> float:
    """DeepSeek-R1's attention scale as SGLang computes it (model_config.scaling); `head_dim` is the
    model's q/k head dim Dq (qk_nope_head_dim + qk_rope_head_dim)."""
    mscale = 0.1 * MSCALE_ALL_DIM * math.log(ROPE_SCALING_FACTOR) + 1.0
    return float(head_dim) ** -0.5 * mscale * mscale


_WORKSPACES: dict[tuple[str, str, int], torch.Tensor] = {}


def shared_workspace(name: str, nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    """One workspace per (name, device), shared by every bind, as SGLang shares one across its wrappers.

    Rotated input sets each bind a launcher; they run one after another, so sharing is safe and keeps
    64 sets from holding 64 x 384 MB.
    """
    key = (name, str(device), nbytes)
    if key not in _WORKSPACES:
        alloc = torch.zeros if zeroed else torch.empty
        _WORKSPACES[key] = alloc(nbytes, dtype=torch.uint8 if not zeroed else torch.int8, device=device)
    return _WORKSPACES[key]


def case_softmax_scale(case: Case) -> float:
    """The softmax scale of `case`'s model."""
    return mla_softmax_scale(int(case.model["Dq"]))
