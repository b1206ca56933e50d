"""`dskbench pick`: the fastest correct backend per op of a deployment, and the server flags that choose it.

deployment (the deployment file: ops in execution order, candidates, paths, flags) -> index (results by
kernel, op and point) -> evaluate / estimate (a candidate's time, measured or estimated) -> rows and
choose (the choice per row and batch point, a step's total) -> tables, markdown, json_out, page (what
it shows) -> command (the command's body)."""
