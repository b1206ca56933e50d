"""The kernel registry: trace documents -> one YAML file per kernel (kernels_registry/) -> entries.

traces.py (the markdown walker, with trace_cells.py and trace_model.py) reads the documents; aliases.py
their vocabulary; merge.py and ops.py build each entry; generate.py writes and checks a folder it owns
through manifest.py; command.py is `dskbench registry generate`; load.py reads the folder back into
model.py's typed records.
"""
