"""Traced names that are not GPU kernels: `weak_ref_tensor` (catalogue 12.1) and
`cutlass_mla_get_workspace_size` (1.2). Neither gets an adapter.

* `weak_ref_tensor` (`sgl_kernel.memory.weak_ref_tensor` -> AOT op `weak_ref_tensor`) returns a
  non-owning alias of its input and launches nothing: a device-side timing would measure an empty
  stream, so it keeps its registry status `utility`. SGLang 0.5.16 calls it from
  `sglang.srt.compilation.weak_ref_tensor` (piecewise CUDA-graph bookkeeping), on every arch.
* `cutlass_mla_get_workspace_size` (`sgl_kernel.attention`) is a host function sizing the workspace of
  the sm100-only `cutlass_mla_decode` (registry status `host-only`). SGLang 0.5.16 calls it only from
  the cutlass_mla attention backend, which sm90 never selects (Hopper's MLA default is fa3).

The two helpers below are for the lead's GPU tests: each resolves the real function (or takes one) and
raises ValueError when the result is wrong.
"""

from __future__ import annotations

from typing import Any

from dskbench.adapters.backends import import_target

WEAK_REF_TARGET = "sgl_kernel.memory:weak_ref_tensor"
WORKSPACE_TARGET = "sgl_kernel.attention:cutlass_mla_get_workspace_size"


def cutlass_mla_workspace_size(
    max_seq_len: int = 163840,
    num_batches: int = 64,
    sm_count: int = 0,
    num_kv_splits: int = 1,
    fn: Any = None,
) -> int:
    """Workspace bytes for cutlass_mla_decode at DeepSeek's context length; must be a positive int."""
    fn = fn if fn is not None else import_target(WORKSPACE_TARGET, ("sgl_kernel",))
    size = fn(max_seq_len, num_batches, sm_count, num_kv_splits)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"cutlass_mla_get_workspace_size returned {size!r}, expected a positive int")
    return size


def check_weak_ref(tensor: Any, fn: Any = None) -> Any:
    """Run weak_ref_tensor on `tensor`; the result must alias it (same storage, shape, strides, dtype)."""
    fn = fn if fn is not None else import_target(WEAK_REF_TARGET, ("sgl_kernel",))
    out = fn(tensor)
    same = (
        out.data_ptr() == tensor.data_ptr()
        and tuple(out.shape) == tuple(tensor.shape)
        and tuple(out.stride()) == tuple(tensor.stride())
        and out.dtype == tensor.dtype
        and out.device == tensor.device
    )
    if not same:
        raise ValueError(
            f"weak_ref_tensor did not alias its input: ptr {out.data_ptr():#x} vs {tensor.data_ptr():#x}, "
            f"shape {tuple(out.shape)}, strides {tuple(out.stride())}, dtype {out.dtype}"
        )
    return out
