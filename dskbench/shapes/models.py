"""Which models run an op, and the model names `--model` takes.

The shapes file describes DeepSeek-R1; an op entry with `models: [deepseek-v3.2]` is one only DeepSeek-V3.2
runs (its sparse-attention indexer). `dskbench run/warm/list --model NAME` select by these names, and the
registry records them per op, so every command reads one rule: an op without `models` is DeepSeek-R1's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dskbench.shapes.schema import MODELS

DEFAULT_MODEL = "deepseek-r1"  # the shapes file's model: what an op without `models` belongs to


class ModelError(ValueError):
    """A model name dskbench does not know (the message names it and the known ones)."""


def op_models(models: Sequence[str] | None) -> tuple[str, ...]:
    """The models that run an op whose `models` list is `models` (empty: DeepSeek-R1)."""
    return tuple(models or ()) or (DEFAULT_MODEL,)


def parse_model(name: str) -> str:
    """A model name as `--model` takes it (any case: `DeepSeek-V3.2` too) -> its key in MODELS."""
    key = name.strip().lower()
    if key not in MODELS:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return key


def short_name(model: str) -> str:
    """`deepseek-v3.2` -> `V3.2`: how `dskbench list` writes a model in its column."""
    return MODELS[model].removeprefix("DeepSeek-")


def sorted_models(models: Iterable[str]) -> list[str]:
    """Models in the order MODELS lists them (R1 before V3.2), each once."""
    found = set(models)
    return [m for m in MODELS if m in found]
