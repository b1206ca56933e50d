"""`weak_ref_tensor`: a traced name that is not a GPU kernel; it gets no adapter.

`weak_ref_tensor` (`sgl_kernel.memory.weak_ref_tensor` -> AOT op `weak_ref_tensor`) returns a non-owning
alias of its input and launches nothing: a device-side timing would measure an empty stream, so it keeps
its registry status `utility`. SGLang 0.5.16 calls it from `sglang.srt.compilation.weak_ref_tensor`
(piecewise CUDA-graph bookkeeping), on every arch.

`check_weak_ref` is for GPU tests: it resolves the real function (or takes one) and raises ValueError
when the result is not an alias.
"""

from __future__ import annotations

from typing import Any

from dskbench.adapters.backends import import_target

WEAK_REF_TARGET = "sgl_kernel.memory:weak_ref_tensor"


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
