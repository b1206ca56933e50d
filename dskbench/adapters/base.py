"""What an adapter is: how to build one kernel's inputs at a Case, its torch reference, its backends,
and its minimum memory traffic and FLOPs.

Adding a backend to a kernel is one line in its adapter's ``backends`` list. Adding a kernel is one
class with ``@register``. The runner (dskbench/execution/runner.py) does everything else: gating, resolution,
correctness against the reference on fresh inputs, timing through dskbench.measure, and metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from dskbench.adapters.backends import CPU_OK, Backend
from dskbench.shapes.cases import Case


@dataclass(frozen=True)
class Traffic:
    """Minimum traffic: each input read once, each output written once (scales and FP4 packing counted)."""

    bytes: int
    flops: int = 0
    note: str = ""
    compute: str = "bf16"  # the tensor-core rate the FLOPs compare with: bf16, fp8 or fp4 (int8 -> fp8 rate)


@dataclass(frozen=True)
class Check:
    ok: bool
    error: float  # relative error ||out - ref|| / ||ref|| (or the adapter's own measure, see detail)
    tolerance: float
    detail: str = ""


# Relative-error tolerances by output dtype name (an fp32 kernel lands far under 1e-3 of
# the fp32 reference, a bf16 one at 1e-3..1e-2: bf16 keeps 8 bits of mantissa).
TOLERANCES = {
    "float64": 1e-9,
    "float32": 1e-4,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float8_e4m3fn": 7e-2,
    "float8_e5m2": 1.3e-1,
}


def dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64; inf when shapes differ or out has NaN/Inf."""
    import torch

    # float64 on the output's own device: a GPU computes the norms of a 100M-element output in ms
    o = out.detach().to(torch.float64)
    r = ref.detach().to(o.device, torch.float64)
    if o.shape != r.shape:
        return float("inf")
    if not torch.isfinite(o).all():
        return float("inf")
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, list | tuple) else (x,)


class Adapter:
    """One traced kernel. Subclasses set the class attributes and implement the four methods."""

    kernel: ClassVar[str]  # the registry name (kernels_registry/<kernel>.yaml)
    role: ClassVar[str]  # which view of an op's shapes it reads (shapes file `roles`)
    backends: ClassVar[list[Backend]] = []
    # Ops to use when the registry entry names none that has this adapter's role (e.g. a kernel whose
    # trace gives no op, or a Hopper replacement measured at an NVFP4 op's shapes).
    ops: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    # backend name -> the implementation it launches, for a backend whose call another kernel's adapter
    # makes too (same function, arguments, inputs, check): such twins are measured once
    # (dskbench.execution.twins). Read from the class's own body only: a subclass never inherits it.
    implementation: ClassVar[dict[str, str]] = {}

    # -- to implement -----------------------------------------------------------------------------
    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        """Fresh random inputs (never zeros) shaped as SGLang feeds the kernel for DeepSeek-R1."""
        raise NotImplementedError

    def reference(self, inputs: dict[str, Any], case: Case) -> Any:
        """The torch oracle, in float32/float64. Must not modify `inputs`."""
        raise NotImplementedError

    def traffic(self, case: Case) -> Traffic:
        raise NotImplementedError

    # -- optional ---------------------------------------------------------------------------------
    def traffic_for(self, backend: str, case: Case) -> Traffic:
        """Traffic of one backend: a backend with other numerics (e.g. weight-only W4A16 Marlin for a
        W4A4 kernel) moves other bytes and runs at another rate. Default: the kernel's traffic()."""
        return self.traffic(case)

    def scratch_bytes(self, backend: str, case: Case) -> int:
        """GPU memory a backend allocates beyond the case's traffic (a workspace sized as its caller sizes
        it): the memory gate counts it, so a case that cannot fit is skipped before it is tried."""
        return 0

    def applies(self, case: Case) -> bool:
        """False drops the case silently (e.g. an FP8 GEMM kernel at an op whose weight is BF16 here)."""
        return True

    def skip_reason(self, case: Case) -> str | None:
        """A reason this kernel does not apply to this case (e.g. dsv3_fused_a_gemm needs T <= 16)."""
        return None

    def cpu_skip_reason(self, case: Case) -> str | None:
        """Why this case's torch reference is too slow to time on a CPU (a CPU reference run skips it
        with this reason instead of running into its time limit); None: it runs there."""
        return None

    def gpus_needed(self, case: Case) -> int:
        """GPUs, one process each, the case needs (a communication kernel: its TP degree)."""
        return 1

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        """Default: relative Frobenius error of each output tensor against a dtype-set tolerance."""
        outs, refs = _as_tuple(out), _as_tuple(ref)
        if len(outs) != len(refs):
            return Check(False, float("inf"), 0.0, f"{len(outs)} outputs, reference has {len(refs)}")
        errs = [(rel_error(o, r), self.tolerance(o, case)) for o, r in zip(outs, refs, strict=True)]
        worst_err, worst_tol = max(errs, key=lambda et: et[0] / et[1])
        detail = " ".join(f"out{i}:{e:.2e}/{t:.0e}" for i, (e, t) in enumerate(errs))
        return Check(all(e <= t for e, t in errs), worst_err, worst_tol, detail)

    def tolerance(self, out: Any, case: Case) -> float:
        return TOLERANCES.get(dtype_name(out), 1e-2)

    def reference_backend(self) -> Backend:
        """The torch reference as a timed backend (the only one on a CPU-only machine)."""
        return Backend(
            name="torch-ref",
            target=None,
            package="torch",
            kind="torch",
            bind=self._bind_reference,
            requires=CPU_OK,
            capturable=False,
            note="fp32 torch reference (the correctness oracle)",
        )

    def all_backends(self) -> list[Backend]:
        return [*self.backends, self.reference_backend()]

    def reference_output(self, ref: Any) -> Any:
        """The reference shaped as the kernel's output (a reference may carry extra fields its check
        uses, e.g. a mask of near-tie tokens): what the timed torch-ref backend returns."""
        return ref

    def _bind_reference(self, fn: Any, inputs: dict[str, Any], case: Case) -> Callable[[], Any]:
        return lambda: self.reference_output(self.reference(inputs, case))


MEMO_PREFIX = "_memo_"


def memo(inputs: dict[str, Any], key: str, fn: Callable[[], Any], sources: tuple[str, ...]) -> Any:
    """A tensor a reference derives from some inputs alone (a dequantised weight), computed once per
    input set: a timed CPU reference then measures its math, not one dequantisation per call. Stored in
    `inputs` under a private key no backend reads; recomputed when any of `sources` is another tensor
    or was modified in place since (identity and version counter)."""
    k = MEMO_PREFIX + key
    stamp = tuple((id(inputs[n]), getattr(inputs[n], "_version", None)) for n in sources)
    hit = inputs.get(k)
    if hit is None or hit[0] != stamp:
        hit = (stamp, fn())
        inputs[k] = hit
    return hit[1]


def input_bytes(inputs: dict[str, Any]) -> int:
    """Bytes of the tensors in an input set (decides how many sets to rotate through)."""
    total = 0
    for name, v in inputs.items():
        if name.startswith(MEMO_PREFIX):
            continue
        if hasattr(v, "element_size") and hasattr(v, "numel"):
            total += v.element_size() * v.numel()
    return total
