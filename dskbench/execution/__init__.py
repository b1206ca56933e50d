"""The execution engine: every path that runs cases (a sweep on one GPU or sharded over several,
`dskbench warm`, the asv and pytest-benchmark suites through the sweep) runs them here. The collective
benchmarks (`dskbench comm`, one process per GPU under torchrun) use its gating, hang limits,
process kills and recorder.

    config.py   what a run asks for: RunConfig (selection + SweepOptions), planned once for every front end
    items.py    what runs: WorkItem, SweepOptions, seeds, twins
    gate.py     whether a case can run on this device (the one gating chain)
    case.py     one case in its process: prepare, check, time; every failure an error record
    cost.py     a case's expected seconds (shard cut, hang limits)
    limits.py   how long a case may run before it counts as hung
    worker.py   the worker process
    process.py  one watched worker process and its protocol; hung, crashed, poisoned cases lost alone
    pool.py     slots (GPUs, build jobs) running units of items through watched workers
    sweep.py    the results file, the environment record, the recorder, the run
    shared_gpu.py  other processes on the run's GPUs: start-of-run warning, per-result field, --exclusive
    warm.py     parallel JIT builds (`dskbench warm`), the builds' keys and order
    build_ahead.py  those builds beside a run's measuring (`run --build-ahead`); gpu_lock.py keeps them
                out of its sampling
    outcome.py  which records fail a run (not a CPU reference run's time-outs), the lines it ends with
"""
