"""Reading the cells of a trace document's markdown: kernel names, op labels, call sites, column roles.

Pure text functions, so each layout rule can be tested on one cell.
"""

from __future__ import annotations

import re

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<href>[^)\s]+)\)")

# Column header -> role. Headers are compared lowercased, with any "(...)" remark removed.
COLUMN_ROLES = {
    "kernel": "kernel",
    "kernels": "kernels",
    "primary kernels": "kernels",
    "source": "source",
    "category": "category",
    "primary call site": "call_sites",
    "call sites": "call_sites",
    "definition file": "definition",
    "file": "file",
    "target ops": "ops",
    "ops using it": "ops",
    "op call sites": "op_call_sites",
    "op": "op",
    "input shape": "input",
    "output shape": "output",
    "module": "module",
    "kernel count": "count",
    "count": "count",
}


def clean_path(p: str) -> str:
    p = p.strip().strip("`")
    while p.startswith("../"):
        p = p[3:]
    return p


def href_site(href: str) -> str:
    """`../a/b.py#L12` -> `a/b.py:12`."""
    path, _, frag = href.partition("#")
    m = re.match(r"L(\d+)", frag)
    return f"{clean_path(path)}:{m.group(1)}" if m else clean_path(path)


def clean_name(s: str) -> str:
    """`` `fused_moe_kernel[grid]()` `` -> ``fused_moe_kernel``."""
    s = s.strip().strip("`").strip()
    s = re.sub(r"\[[^\]]*\]$", "", s.removesuffix("()"))
    return s.removesuffix("()").strip()


def slugify(s: str) -> str:
    """`Custom All-Reduce` -> `custom_all_reduce`."""
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def split_top(s: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside parentheses and backticks."""
    out, depth, tick, cur = [], 0, False, []
    for ch in s:
        if ch == "`":
            tick = not tick
        elif not tick and ch == "(":
            depth += 1
        elif not tick and ch == ")":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0 and not tick:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def split_cells(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", s)]


def strip_markup(s: str) -> str:
    return re.sub(r"\*\*|`", "", s).strip()


def column_role(header: str) -> str | None:
    h = re.sub(r"\s*\(.*\)\s*$", "", header.strip().lower())
    return COLUMN_ROLES.get(h)


def kernels_in_cell(cell: str, plural: bool) -> list[tuple[str, str | None]]:
    """Kernel names in a table cell, each with the remark that follows it ("(B<=16)").

    Backticked names when there are any ("`a` (B<=16) / `b`"); otherwise plain identifiers
    separated by commas. Text with spaces ("flashinfer/trtllm prefill", "custom_ar operations") is
    a description, not a kernel.
    """
    out: list[tuple[str, str | None]] = []
    if "`" in cell:
        for m in re.finditer(r"`([^`]+)`(?:\s*\(([^)]*)\))?", cell):
            name = clean_name(m.group(1))
            if IDENT.match(name):
                out.append((name, m.group(2)))
        return out
    parts = split_top(cell) if plural else [cell]
    for p in parts:
        name = clean_name(strip_markup(p))
        if IDENT.match(name):
            out.append((name, None))
    return out


def op_labels_in_cell(cell: str) -> list[str]:
    """Op labels in a "Target Ops" / "Ops Using It" cell, each with its remark."""
    if "`" in cell:
        return [
            f"{m.group(1).strip()} ({m.group(2)})" if m.group(2) else m.group(1).strip()
            for m in re.finditer(r"`([^`]+)`(?:\s*\(([^)]*)\))?", cell)
        ]
    return [strip_markup(p) for p in split_top(cell)]


def sites_in_cell(cell: str, default_file: str | None) -> list[str]:
    """`:1300, :1340` (+ a default file) / `a.py:74, b.py` / `[L12](path#L12)` -> sites."""
    cell = cell.strip()
    links = list(LINK.finditer(cell))
    if links:
        return [href_site(m.group("href")) for m in links]
    if re.fullmatch(r"\(.*\)", cell):  # "(same as ...)", "(via communicator.py)"
        return []
    m = re.search(r"\(([\w./-]+\.\w+)\)\s*$", cell)
    if m:
        default_file, cell = m.group(1), cell[: m.start()]
    out = []
    for tok in split_top(cell):
        tok = tok.strip("` ")
        if re.fullmatch(r":\d+", tok):
            if default_file:
                out.append(f"{default_file}{tok}")
        elif re.fullmatch(r"[\w./-]+\.\w+(:\d+)?", tok):
            out.append(clean_path(tok))
    return out
