"""The `dskbench` command line, one module per command:

app.py       main(): parse, dispatch, exit codes (interrupts, usage errors, a closed pipe)
parser.py    the argument parser, assembled from the commands' own
args.py      argument types shared by the commands (--tp, --seed, --point, ...)
common.py    exit codes, UsageError, the registry, shapes and device a command plans with
plan.py      a run configuration planned, an empty plan explained
run.py       dskbench run (resume.py: --out and --resume)
warm.py      dskbench warm
kernels.py   dskbench list
compare.py   dskbench compare
pick.py      dskbench pick
report.py    dskbench report
registry.py  dskbench registry generate
stats.py     dskbench stats (how a sweep went)       plan_stats.py   dskbench plan-stats (a plan's size)
run_to_run.py dskbench run-to-run (two sweeps' spread) noise_prior.py dskbench noise-prior (compare's prior)
pack.py      dskbench pack (a results file for committing)
comm.py      dskbench comm (communication kernels, one process per GPU under torchrun)
insitu.py    dskbench insitu, fidelity.py dskbench fidelity, selftest.py dskbench selftest (GPU checks)
"""

from dskbench.frontends.cli.app import main
from dskbench.frontends.cli.common import EXIT_FAIL, EXIT_OK, EXIT_PIPE, EXIT_USAGE, SWEEPS
from dskbench.frontends.cli.parser import build_parser

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_PIPE", "EXIT_USAGE", "SWEEPS", "build_parser", "main"]
