"""Argument types and the parser class the commands share: one-line errors, the same checks everywhere."""

from __future__ import annotations

import argparse
import math

from dskbench.frontends.cli.common import EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (`dskbench: argument --tp: ...`) instead of usage + error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"dskbench: {message} (see `{self.prog} --help`)\n")


def case_timeout(s: str) -> float:
    from dskbench.execution.limits import LimitError, parse_timeout

    try:
        return parse_timeout(s, "--case-timeout")
    except LimitError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--case-timeout: ")) from None


def seconds_or_zero(s: str) -> float:
    """A number of seconds >= 0 (--first-use-allowance)."""
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {s!r}")
    return x


def add_limits(p: argparse.ArgumentParser, what: str) -> None:
    """--case-timeout and --first-use-allowance: how long `what` may run before its worker is killed."""
    p.add_argument(
        "--case-timeout",
        type=case_timeout,
        metavar="S",
        help=f"kill {what}'s worker after S seconds without its result, first uses included (0 = never; "
        "default: scaled from the case's expected time; env DSKBENCH_CASE_TIMEOUT_S)",
    )
    p.add_argument(
        "--first-use-allowance",
        type=seconds_or_zero,
        metavar="S",
        help="seconds added to the limit of a kernel's first case in a worker (in-process JIT compilers; "
        "default: 120 with scaled limits, none with --case-timeout)",
    )


def positive_int(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return n


def positive_ints(s: str) -> tuple[int, ...]:
    """`1,4,8`: comma-separated positive integers, each once."""
    try:
        values = [int(x) for x in s.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {s!r}")
    return tuple(dict.fromkeys(values))


def seed(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {s!r}")
    return n


def seconds(s: str) -> float:
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {s!r}")
    return x


def gpus(s: str) -> str:
    """'all' or a count (checked against the GPUs visible when the command runs)."""
    if s.strip().lower() != "all":
        try:
            positive_int(s)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected 'all' or a number of GPUs, got {s!r}") from None
    return s


def point(s: str) -> dict[str, int]:
    from dskbench.execution.selection import parse_point

    try:
        return parse_point(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def model(s: str) -> str:
    """A model name (`deepseek-r1`, `deepseek-v3.2`; any case), checked against the shapes file's models."""
    from dskbench.shapes.models import ModelError, parse_model

    try:
        return parse_model(s)
    except ModelError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_model(p: argparse.ArgumentParser, what: str) -> None:
    """--model NAME (repeatable): only `what` of the ops that model runs."""
    from dskbench.shapes.schema import MODELS

    p.add_argument(
        "--model",
        action="append",
        type=model,
        metavar="NAME",
        help=f"only {what} of ops this model runs: {', '.join(MODELS)} (deepseek-r1: the ops without "
        f"`models` in the shapes file; repeatable; default: all {what})",
    )


def add_selection(p: argparse.ArgumentParser) -> None:
    """--model, --op and --point: the filters of run and warm (a record's repro command selects its one
    case with --op and --point)."""
    add_model(p, "cases")
    p.add_argument(
        "--op",
        action="append",
        metavar="OP[:VARIANT]",
        help="only cases of this op (a variant after ':', as in case ids; repeatable)",
    )
    p.add_argument(
        "--point",
        action="append",
        type=point,
        metavar="K=V[,K=V]",
        help="only cases at this sweep point, e.g. B=64 or B=1,kv_len=1024,tp=1 (repeatable)",
    )
