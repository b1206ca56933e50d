"""`dskbench`'s entry point: parse, run the command, turn interrupts, usage errors and a closed pipe
into exit codes."""

from __future__ import annotations

import sys

from dskbench.frontends.cli.common import EXIT_PIPE, EXIT_USAGE, Terminated, UsageError, on_sigterm
from dskbench.frontends.cli.compare import split_sides
from dskbench.frontends.cli.parser import COMMANDS, build_parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. A reader that closes stdout early (`dskbench list | head -3`)
    ends the command quietly with EXIT_PIPE, as a shell reports for a tool stopped by SIGPIPE."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could only print a warning
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_PIPE


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null: what its buffer still holds goes nowhere at exit, without an error."""
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):  # stdout is not a file (captured): nothing will flush to the pipe
        pass


def _main(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(split_sides(sys.argv[1:] if argv is None else list(argv)))
    except SystemExit as e:  # --help, or a usage error already printed: its exit code
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if args.command in ("run", "warm"):
            from dskbench.execution.limits import LimitError, timeout_from_env

            try:
                timeout_from_env()
            except LimitError as e:
                print(f"dskbench: {e}", file=sys.stderr)
                return EXIT_USAGE
        command = COMMANDS.get(args.command)
        if command is not None:
            return command.command(args)
    except UsageError as e:
        print(f"dskbench: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        print(f"dskbench: interrupted ({'SIGTERM' if term else 'SIGINT'})", file=sys.stderr)
        return 143 if term else 130
    return EXIT_USAGE
