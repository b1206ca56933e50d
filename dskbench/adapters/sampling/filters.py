"""What the sampling kernels share: their inputs (probs [B, 129280] fp32 and per-request parameters) and
their oracle (the filter sets, renormalisation and the checks).

Inputs: softmax(logits / 0.6) (DeepSeek-R1's recommended temperature) of random logits with a boosted
head of candidates whose strength varies per row, so some rows are peaked and some flat; per-row
parameters cycle through SGLang-typical values (top_k 20..100, top_p 0.8..0.95, min_p 0.02..0.1), passed
as per-request tensors as the sampler does.

Checks: renorm outputs must keep every token surely inside the filter, nothing surely outside it, and
equal the input renormalised over the kept set (fp32 tolerance). Boundary tokens whose cumulative mass is
within 1e-4 of top_p (or ties with the k-th value) may go either way. Samplers: each sampled id must
carry mass after the reference filter (per row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dskbench.adapters.base import TOLERANCES, Adapter, Check, Traffic, rel_error
from dskbench.adapters.common.inputs import device_generator, generator
from dskbench.shapes.cases import Case

TEMPERATURE = 0.6
TOP_KS = (20, 40, 50, 100)
TOP_PS = (0.8, 0.9, 0.95)
MIN_PS = (0.02, 0.05, 0.1)
BAND = 1e-4  # cumulative-mass band around top_p in which a token may be kept or dropped


@dataclass(frozen=True)
class FilterRef:
    """A filtering kernel's oracle: the nominal result and the sets any correct kernel must respect."""

    value: torch.Tensor  # renormalised probs [B, V] or sampled ids [B]
    may: torch.Tensor  # bool [B, V]: tokens a correct kernel may keep / sample
    must: torch.Tensor | None = None  # bool [B, V]: tokens it must keep (renorm only)
    base: torch.Tensor | None = None  # input probs on `may`, to renormalise over the kernel's own set


def make_probs(
    b: int, v: int, gen: torch.Generator, device: str, lead: tuple[float, float] = (0.0, 0.0)
) -> torch.Tensor:
    """softmax(logits / T) of unit-normal logits plus a boosted head of 64 candidates per row (boost up
    to 6..11, drawn per row); one head token gets a further boost drawn in `lead` (confident rows)."""
    dgen = device_generator(gen, device)
    logits = torch.randn((b, v), generator=dgen, device=device)
    head = 64
    idx = torch.randint(0, v, (b, head), generator=dgen, device=device)
    strength = 6.0 + 5.0 * torch.rand((b, 1), generator=dgen, device=device)
    boost = torch.rand((b, head), generator=dgen, device=device) * strength
    boost[:, 0] += lead[0] + (lead[1] - lead[0]) * torch.rand(b, generator=dgen, device=device)
    logits.scatter_add_(1, idx, boost)
    return torch.softmax(logits / TEMPERATURE, dim=-1)


def _cycle(values: tuple[Any, ...], b: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor([values[i % len(values)] for i in range(b)], dtype=dtype).to(device)


# -- filter sets (fp64 on the input's device) ----------------------------------------------------------


def _sorted(p: torch.Tensor) -> torch.Tensor:
    return p.double().sort(dim=-1, descending=True).values


def top_k_sets(p: torch.Tensor, top_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nominal, must, may) for keeping the k largest probabilities of each row."""
    s = _sorted(p)
    k = top_k.long()[:, None]
    kth = s.gather(1, (k - 1).clamp(0, p.shape[1] - 1))
    after = s.gather(1, k.clamp(0, p.shape[1] - 1))  # the (k+1)-th value: anything above it is in
    pd = p.double()
    must = (pd > after) | (k >= p.shape[1])
    return pd >= kth, must, pd >= kth


def top_p_sets(p: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nominal, must, may): the smallest head whose mass reaches top_p (flashinfer's threshold rule)."""
    s = _sorted(p)
    before = s.cumsum(-1) - s
    tp = top_p.double()[:, None]

    def keep_at_least(limit: torch.Tensor) -> torch.Tensor:
        # tokens whose prob is >= the last sorted value with cumulative mass before it < limit
        last = (before < limit).sum(-1, keepdim=True).clamp(1, p.shape[1]) - 1
        return p.double() >= s.gather(1, last)

    nominal = keep_at_least(tp)
    # surely kept: strictly above the first sorted value whose cumulative mass before it >= top_p - BAND
    first_out = (before < tp - BAND).sum(-1, keepdim=True).clamp(1, p.shape[1] - 1)
    must = p.double() > s.gather(1, first_out)
    return nominal, must, keep_at_least(tp + BAND)


def min_p_sets(p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """may: tokens with p >= min_p * max(p) (slack of 1e-5 relative on the threshold)."""
    thr = min_p.double()[:, None] * p.double().amax(-1, keepdim=True)
    return p.double() >= thr * (1 - 1e-5)


def renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`p` renormalised over the kept tokens (summed in fp64), fp32."""
    kept = p.double() * keep
    return (kept / kept.sum(-1, keepdim=True)).float()


def sample_kept(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """One token id per row drawn from `p` restricted to the kept tokens (int32)."""
    return torch.multinomial(renorm(p, keep), 1).squeeze(1).to(torch.int32)


# -- checks --------------------------------------------------------------------------------------------


def check_renorm(out: Any, ref: FilterRef) -> Check:
    probs = out.value if isinstance(out, FilterRef) else out
    if tuple(probs.shape) != tuple(ref.may.shape):
        return Check(False, float("inf"), 0.0, f"shape {tuple(probs.shape)}")
    kept = probs > 0
    assert ref.must is not None and ref.base is not None
    dropped = int((ref.must & ~kept).any(-1).sum())
    extra = int((kept & ~ref.may).any(-1).sum())
    expected = renorm(ref.base, kept)
    err = rel_error(probs, expected)
    tol = TOLERANCES["float32"]
    ok = dropped == 0 and extra == 0 and err <= tol
    return Check(ok, err, tol, f"rows dropping kept tokens:{dropped} rows keeping filtered tokens:{extra}")


def check_samples(out: Any, ref: FilterRef) -> Check:
    ids = out.value if isinstance(out, FilterRef) else out
    b, v = ref.may.shape
    if tuple(ids.shape) != (b,):
        return Check(False, float("inf"), 0.0, f"ids shape {tuple(ids.shape)}, expected ({b},)")
    ids = ids.long()
    in_range = (ids >= 0) & (ids < v)
    allowed = ref.may.gather(1, ids.clamp(0, v - 1)[:, None]).squeeze(1) & in_range
    bad = int((~allowed).sum())
    return Check(bad == 0, bad / b, 0.0, f"rows sampling a filtered-out token:{bad}/{b}")


# -- the adapters' common inputs -----------------------------------------------------------------------


class SamplingAdapter(Adapter):
    """Probs [B, V] and per-request top_k / top_p / min_p tensors (role sampling of sampler.forward)."""

    role = "sampling"
    ops = ("sampler.forward",)

    def make_inputs(self, case: Case, device: str, seed: int) -> dict[str, Any]:
        b, v = int(case.dims["B"]), int(case.dims["V"])
        return {
            "probs": make_probs(b, v, generator(seed), device),
            "top_k": _cycle(TOP_KS, b, torch.int32, device),
            "top_p": _cycle(TOP_PS, b, torch.float32, device),
            "min_p": _cycle(MIN_PS, b, torch.float32, device),
            "seed": int(seed),
        }

    def traffic(self, case: Case) -> Traffic:
        b, v = int(case.dims["B"]), int(case.dims["V"])
        return Traffic(bytes=4 * b * v + 12 * b, note="one fp32 read of probs (kernels make several passes)")
