"""What the asv and pytest-benchmark front ends share: which cases to run, and their measurements as
plain dicts.

Neither front end times anything. Both build a RunConfig (config.py), ask for its plan (kernel -> work
items, computed once and cached on disk so that asv's many short-lived processes never import torch
or a kernel library: plan.py, plan_cache.py, the planner subprocess in __main__.py), then for a
kernel's measurements (measure.py): ``run_sweep`` in an isolated worker (a crashing kernel costs one
case), results to a JSON-lines file (a copy is kept), read back and flattened.

A case is addressed by its key ``"<case_id>|<backend>"`` (asv expands ``params`` as a Cartesian
product; the valid (case, backend) pairs are sparse, so they are flattened into one string param).
"""
