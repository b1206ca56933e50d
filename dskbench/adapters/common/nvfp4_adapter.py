"""What every NVFP4 adapter shares beyond the format: arch requirements, the Hopper (W4A16) labels, and
checking an output against the reference of the numerics its backend declares.

Blackwell (sm100) runs nvidia/DeepSeek-R1-NVFP4-v2 W4A4: activations are NVFP4-quantised and multiplied
with NVFP4 weights. Hopper has no FP4 tensor cores: SGLang 0.5.16 runs the same weights W4A16 through
Marlin, activations staying BF16. Those Hopper backends sit on the same adapters, carry
``label="Hopper path: ..."`` and ``extra["numerics"] = "w4a16"``, and their launchers return
``Tagged(out, "w4a16")`` so that ``check`` compares them with the W4A16 reference (unquantised
activations) instead of the W4A4 one.

The sm100 backends have not been run on a Blackwell GPU yet: their binders follow the libraries' sources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from dskbench.adapters.backends import Requirement
from dskbench.adapters.base import Adapter, Check, Traffic, rel_error
from dskbench.shapes.cases import Case

# flashinfer's declared lists: mm_fp4 cutlass/cudnn `@supported_compute_capability([100, 103, 110, 120, 121])`;
# fp4_quantize builds an sm90 module but its quantize body is compiled only for __CUDA_ARCH__ >= 1000.
FI_FP4 = Requirement(sm=(100, 103, 110, 120, 121))
MARLIN = Requirement(min_sm=80)  # Marlin kernels: sm80+ (what SGLang picks for sm80..sm90)
SM90_PLUS = Requirement(min_sm=90)  # flashinfer builds fp4 modules for sm90 and newer only

HOPPER_GEMM = (
    "Hopper path: Marlin W4A16 gptq_marlin_gemm (b_q_type=float4_e2m1f), weights prepared as "
    "prepare_nvfp4_layer_for_marlin; activations stay BF16"
)
HOPPER_MOE = (
    "Hopper path: Marlin MoE, whole sequence moe_align_block_size + moe_wna16_marlin_gemm (gate_up) + "
    "silu_and_mul + moe_wna16_marlin_gemm (down, x topk weight) + moe_sum_reduce; W4A16"
)


@dataclass(frozen=True)
class Tagged:
    """A launcher output that names the numerics (and, for quantisers, the layout) that produced it."""

    value: Any
    numerics: str = "w4a4"
    layout: str | None = None


class Refs:
    """References by numerics. The adapter's own numerics is computed at once (torch-ref times it);
    the others only when a backend needs them."""

    def __init__(
        self, primary: str, makers: dict[str, Callable[[], Any]], meta: dict[str, Any] | None = None
    ):
        self.primary = primary
        self.meta = meta or {}
        self._makers = makers
        self._done: dict[str, Any] = {}
        self.get(primary)

    def get(self, numerics: str) -> Any:
        if numerics not in self._done:
            if numerics not in self._makers:
                raise KeyError(f"no {numerics!r} reference (have {', '.join(self._makers)})")
            self._done[numerics] = self._makers[numerics]()
        return self._done[numerics]


def untag(out: Any, primary: str) -> tuple[Any, str, str | None]:
    """(value, numerics, layout) of a launcher output; the torch-ref backend returns the Refs themselves
    (layout "linear": quantisers' references keep the checkpoint's linear scale layout)."""
    if isinstance(out, Tagged):
        return out.value, out.numerics, out.layout
    if isinstance(out, Refs):
        return out.get(primary), primary, "linear"
    return out, primary, None


class NumericsAdapter(Adapter):
    """Checks a tensor output against the reference of the numerics its backend declares."""

    primary: ClassVar[str] = "w4a4"
    tolerances: ClassVar[dict[str, float]] = {"w4a4": 2e-2, "w4a16": 2e-2}

    def traffic_w4a16(self, case: Case) -> Traffic:
        """The Hopper (Marlin) row's traffic: bf16 activations, bf16 tensor-core rate."""
        raise NotImplementedError

    def traffic_for(self, backend: str, case: Case) -> Traffic:
        """Per-backend traffic: traffic(case) is the W4A4 kernel's (FP4 rate); a W4A16 backend moves bf16
        activations and runs at the bf16 rate."""
        b = {x.name: x for x in self.all_backends()}[backend]
        return self.traffic_w4a16(case) if b.extra.get("numerics") == "w4a16" else self.traffic(case)

    def check(self, out: Any, ref: Any, case: Case) -> Check:
        value, numerics, _ = untag(out, self.primary)
        r = ref.get(numerics) if isinstance(ref, Refs) else ref
        err = rel_error(value, r)
        tol = self.tolerances[numerics]
        return Check(err <= tol, err, tol, f"{numerics} reference: rel err {err:.2e} / {tol:.0e}")


def next_pow2(n: int) -> int:
    """The autotuner bucket flashinfer's fused MoE kernels are told to tune for (tune_max_num_tokens)."""
    return 1 << (n - 1).bit_length() if n > 0 else 1
