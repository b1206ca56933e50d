"""Parse the trace documents (traces/*.md) into per-kernel facts, whatever their layout.

The documents come in several layouts (a summary + call-chain layout, an older summary layout with
fenced call chains, op -> kernel tables, op shape tables). Rather than one parser per file name, one
markdown walker recognises each *element* from its content: a table by its header (the role of each
column), a ``#### N.M name **(source)**`` kernel section, a fenced ``sgl-kernel: path fn()`` chain.
So a kernel in a new document shows up with no code change, as long as the document is written in
a layout seen before. The facts stay raw (labels as written, line numbers: trace_model.py);
dskbench/registry/merge.py normalises and merges them.
"""

from __future__ import annotations

import re
from pathlib import Path

from dskbench.registry.trace_cells import (
    IDENT,
    LINK,
    clean_name,
    clean_path,
    column_role,
    href_site,
    kernels_in_cell,
    op_labels_in_cell,
    sites_in_cell,
    slugify,
    split_cells,
    strip_markup,
)
from dskbench.registry.trace_model import (
    FileRow,
    Frame,
    KernelFacts,
    OpRef,
    ShapeRow,
    Site,
    TraceDoc,
    TraceError,
    Vote,
)

_HEADING = re.compile(r"^(#{1,6})(?:\s+(.*?))?\s*$")
_KERNEL_HEADING = re.compile(r"^(?:\d+(?:\.\d+)*\.?\s+)?(?P<name>.*?)\s*\*\*\((?P<src>[^)]*)\)\*\*$")
_NUMBER_ONLY = re.compile(r"^\d+(?:\.\d+)*\.?$")
_SEPARATOR = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
_TREE = re.compile(r"^(?P<pre>[\s│]*)(?P<arrow>[├└]─>)\s*(?P<body>.*)$")
_BOLD_NOTE = re.compile(r"\*\*\((?P<note>[^)]*)\)\*\*")
_SOURCE_PREFIX = re.compile(r"^(?P<src>[A-Za-z][\w.+-]*):\s+(?P<path>\S+)(?:\s+(?P<rest>.*))?$")
_PATH_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+)$")
_GENERATED = re.compile(r"Generated:?\**:?\s*(\d{4}-\d{2}-\d{2})")
_STEP = re.compile(r"^##\s+Step\s+\d+\b")

# Which layout a table belongs to, by the roles of its columns (first match wins; informative only).
TABLE_FORMATS = (
    ("kernel-traces", {"kernel", "source", "category", "call_sites"}),
    ("kernel-traces", {"kernel", "ops", "op_call_sites"}),
    ("kernel-traces-legacy", {"kernel", "category", "source", "definition"}),
    ("op-traces", {"op", "kernels", "count"}),
    ("op-traces", {"category", "kernels", "count"}),
    ("execution-ops", {"op", "input", "output", "kernel"}),
    ("execution-ops", {"kernel", "source", "ops"}),
)


# -- the walker ------------------------------------------------------------------------------------


def read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(path, 0, f"cannot read: {e.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise TraceError(path, line, f"not valid UTF-8 (byte {raw[e.start]:#04x})") from None


def parse_trace(path: str | Path) -> TraceDoc:
    """Parse one trace document. A procedure document (``## Step N`` headings) parses to nothing."""
    path = Path(path)
    text = read_text(path)
    lines = text.splitlines()
    gen = _GENERATED.search("\n".join(lines[:30]))
    generated = gen.group(1) if gen else None
    if sum(1 for ln in lines if _STEP.match(ln)) >= 2:
        return TraceDoc(path, "procedure", text, generated)
    walker = _Walker(path, lines)
    walker.run()
    if not walker.formats:
        raise TraceError(path, 1, "matches no known trace format (no kernel table or call chain found)")
    return TraceDoc(
        path,
        "+".join(sorted(walker.formats)),
        text,
        generated,
        walker.kernels,
        walker.warnings,
        walker.file_rows,
    )


class _Walker:
    def __init__(self, path: Path, lines: list[str]):
        self.path = path
        self.lines = lines
        self.kernels: dict[str, KernelFacts] = {}
        self.formats: set[str] = set()
        self.warnings: list[str] = []
        self.file_rows: list[FileRow] = []
        self.headings: dict[int, tuple[str, int]] = {}
        self.kernel: str | None = None  # the kernel of the current `#### name **(src)**` section
        self.chain: list[Frame] | None = None
        self.stack: list[tuple[int, int]] = []
        self.section_kernels: list[str] = []  # kernels found in the current legacy #### section
        self.def_list = False  # inside a "**Definition Files:**" list

    # -- helpers --
    def facts(self, name: str) -> KernelFacts:
        if name not in self.kernels:
            self.kernels[name] = KernelFacts(name)
        return self.kernels[name]

    def section(self) -> str:
        if not self.headings:
            return ""
        return strip_markup(self.headings[max(self.headings)][0])

    def heading(self, level: int) -> tuple[str, int] | None:
        return self.headings.get(level)

    def enclosing_heading(self, level: int) -> tuple[str, int] | None:
        """The nearest enclosing heading of `level` or shallower (a table's "### sgl-kernel")."""
        for lv in range(level, 0, -1):
            if lv in self.headings:
                return self.headings[lv]
        return None

    def chain_section(self) -> str:
        """The "### group / #### title" of the current call-chain section."""
        return " / ".join(strip_markup(self.headings[lv][0]) for lv in (3, 4) if lv in self.headings)

    def mention(self, name: str, line: int) -> KernelFacts:
        f = self.facts(name)
        f.mentions.append((line, self.section()))
        return f

    # -- main loop --
    def run(self) -> None:
        i, n = 0, len(self.lines)
        while i < n:
            line = self.lines[i]
            lno = i + 1
            stripped = line.strip()
            if stripped.startswith("```"):
                end = i + 1
                while end < n and not self.lines[end].strip().startswith("```"):
                    end += 1
                if end == n:
                    raise TraceError(self.path, lno, "code fence (```) never closed")
                self.code_block(i + 2, self.lines[i + 1 : end])
                i = end + 1
                continue
            if stripped.startswith("#"):
                m = _HEADING.match(stripped)
                if m:
                    self.on_heading(len(m.group(1)), (m.group(2) or "").strip(), lno)
                    i += 1
                    continue
            if stripped.startswith("|") and i + 1 < n and _SEPARATOR.match(self.lines[i + 1].strip()):
                end = i + 2
                while end < n and self.lines[end].strip().startswith("|"):
                    end += 1
                self.table(i, self.lines[i:end])
                i = end
                continue
            self.text_line(line, lno)
            i += 1

    def on_heading(self, level: int, text: str, lno: int) -> None:
        for lv in [lv for lv in self.headings if lv >= level]:
            del self.headings[lv]
        self.chain, self.def_list = None, False
        if level <= 4:
            self.kernel = None
            self.section_kernels = []
        if level == 4 and (not text or _NUMBER_ONLY.match(text)):
            raise TraceError(self.path, lno, "#### heading with no name")
        self.headings[level] = (text, lno)
        if level != 4:
            return
        m = _KERNEL_HEADING.match(text)
        if not m:
            return  # a descriptive section title (older layout): kernels come from its chains
        raw = clean_name(m.group("name"))
        if not raw:
            raise TraceError(self.path, lno, f"kernel heading with no kernel name: {text!r}")
        name = raw if IDENT.match(raw) else slugify(raw)
        self.formats.add("kernel-traces")
        self.kernel = name
        f = self.mention(name, lno)
        f.sources.append(Vote(m.group("src"), lno))
        f.chain_sections.append(self.chain_section())
        parent = self.heading(3)
        if parent:
            f.categories.append(Vote(parent[0], parent[1], 2))

    # -- call chains of `#### name **(src)**` sections: "[fn()](path#L12)" lines --
    def text_line(self, line: str, lno: int) -> None:
        s = line.strip()
        if self.def_list and s.startswith("- "):
            self.definition_item(clean_path(s[2:]), lno)
            return
        self.def_list = False
        if s.startswith("**Definition File"):
            rest = s.split(":**", 1)[1].strip() if ":**" in s else ""
            if rest:
                self.definition_item(clean_path(rest), lno)
            else:
                self.def_list = True
            return
        if s.startswith("**Source:**") and len(self.section_kernels) == 1:
            for src in s.split(":**", 1)[1].split("+"):
                self.facts(self.section_kernels[0]).sources.append(Vote(src.strip(), lno, 2))
            return
        if self.kernel is None:
            return
        if line.startswith("["):
            self.chain_root(line, lno)
        elif self.chain is not None:
            m = _TREE.match(line)
            if m:
                self.chain_frame(len(m.group("pre")), m.group("body"), lno)

    def chain_root(self, line: str, lno: int) -> None:
        m = LINK.match(line)
        if not m:
            return
        f = self.facts(self.kernel)  # type: ignore[arg-type]
        site = href_site(m.group("href"))
        fn = m.group("text").strip()
        self.chain = [Frame(fn, site, lno, -1, fn.startswith("self."))]
        self.stack = [(-1, 0)]  # (arrow column, frame index); the kernel call sits left of every arrow
        f.chains.append(self.chain)
        f.call_sites.append(Site(site, lno, "kernel", clean_name(fn)))
        note = _BOLD_NOTE.search(line[m.end() :])
        if note:
            f.sources.append(Vote(note.group("note"), lno))

    def chain_frame(self, col: int, body: str, lno: int) -> None:
        """A caller line: its parent is the nearest line above it with a smaller arrow column."""
        assert self.chain is not None
        m = LINK.match(body)
        if m:
            fn, site = m.group("text").strip(), href_site(m.group("href"))
        else:
            t = re.match(r"`([^`]+)`", body)
            if not t:
                return  # "**(post-forward sampling)**": a note, not a frame
            fn, site = t.group(1).strip(), None
        while self.stack[-1][0] >= col:
            self.stack.pop()
        self.chain.append(Frame(fn, site, lno, self.stack[-1][1], fn.startswith("self.")))
        self.stack.append((col, len(self.chain) - 1))

    def definition_item(self, site: str, lno: int) -> None:
        """A `**Definition File(s):**` entry. Chain leaves already give each kernel's file; the
        section-level entry only adds a file to a section's single kernel that lacks it."""
        if not site or " " in site or len(self.section_kernels) != 1:
            return
        defs = self.facts(self.section_kernels[0]).definitions
        if not any(d.site.split(":")[0] == site.split(":")[0] for d in defs):
            defs.append(Site(site, lno, "definition"))

    # -- fenced call chains of the older layout: "sgl-kernel: path:line fn()" leaves --
    def code_block(self, first_lno: int, block: list[str]) -> None:
        h4 = self.heading(4)
        if h4 is None or self.kernel is not None:
            return
        frames: list[tuple[int, int, str]] = []  # (column, line, body)
        for k, line in enumerate(block):
            if not line.strip():
                continue
            m = _TREE.match(line)
            if m:
                frames.append((len(m.group("pre")), first_lno + k, m.group("body").strip()))
            elif line.strip().startswith("- "):
                frames.append((len(line) - len(line.lstrip()), first_lno + k, line.strip()))
            else:
                frames.append((-1, first_lno + k, line.strip()))
        parents: list[int] = []
        stack: list[tuple[int, int]] = []
        for idx, (col, _, _) in enumerate(frames):
            while stack and stack[-1][0] >= col:
                stack.pop()
            parents.append(stack[-1][1] if stack else -1)
            stack.append((col, idx))
        found = False
        for idx, (_, lno, body) in enumerate(frames):
            m = _SOURCE_PREFIX.match(body)
            if not m or "/" in m.group("src"):
                continue
            found = True
            src, path = m.group("src"), clean_path(m.group("path"))
            rest = " ".join(t for t in (m.group("rest") or "").split() if not t.startswith("@"))
            caller = frames[parents[idx]] if parents[idx] >= 0 else None
            call = _frame_site(caller[2]) if caller else None
            items = [
                (frames[j][1], clean_name(frames[j][2][2:]))
                for j in range(len(frames))
                if parents[j] == idx and frames[j][2].startswith("- ")
            ]
            if rest:
                names = [(lno, clean_name(rest))]
            elif items:
                names = items
            else:  # a leaf naming a file but no function: the section is the kernel
                names = [(lno, slugify(h4[0]))]
            for nlno, name in names:
                if not IDENT.match(name):
                    continue
                f = self.mention(name, nlno)
                f.sources.append(Vote(src, nlno))
                f.definitions.append(Site(path, nlno, "definition"))
                f.chain_sections.append(self.chain_section())
                parent3 = self.heading(3)
                if parent3:
                    f.categories.append(Vote(parent3[0], parent3[1], 2))
                if call:
                    f.call_sites.append(Site(call[0], caller[1], "kernel", call[1]))  # type: ignore[index]
                if name not in self.section_kernels:
                    self.section_kernels.append(name)
        if found:
            self.formats.add("kernel-traces-legacy")

    # -- tables --
    def table(self, start: int, rows: list[str]) -> None:
        header = split_cells(rows[0])
        width = len(header)
        for k, row in enumerate(rows[1:], start=1):
            cells = split_cells(row)
            if len(cells) != width:
                raise TraceError(
                    self.path, start + k + 1, f"table row has {len(cells)} cells, its header has {width}"
                )
        roles = [column_role(h) for h in header]
        present = {r for r in roles if r}
        for fmt, need in TABLE_FORMATS:
            if need <= present:
                self.formats.add(fmt)
                break
        if "kernel" not in present and "kernels" not in present:
            return
        default_file = None
        for h, r in zip(header, roles, strict=True):
            if r == "op_call_sites":
                m = re.search(r"\(([^)]+)\)", h)
                default_file = m.group(1).strip() if m else None
        heading = self.enclosing_heading(3)
        for k, row in enumerate(rows[2:], start=2):
            self.table_row(
                dict(zip(roles, split_cells(row), strict=True)), start + k + 1, default_file, heading
            )

    def table_row(
        self,
        cells: dict[str | None, str],
        lno: int,
        default_file: str | None,
        heading: tuple[str, int] | None,
    ) -> None:
        plural = "kernels" in cells
        cell = cells.get("kernels") if plural else cells.get("kernel")
        kernels = kernels_in_cell(cell or "", plural)
        if not kernels:
            self.file_row(cells, cell or "", lno, plural)
            return
        if "count" in cells and plural:
            m = re.search(r"\d+", cells["count"])
            if m and int(m.group()) != len(kernels):
                label = strip_markup(cells.get("op") or cells.get("category") or "")
                self.warnings.append(
                    f"{self.path.name}:{lno}: {label} says {m.group()} kernels, lists {len(kernels)}"
                )
        op_label = strip_markup(cells["op"]) if cells.get("op") else None
        for name, remark in kernels:
            f = self.mention(name, lno)
            if cells.get("category"):
                f.categories.append(Vote(strip_markup(cells["category"]), lno))
            elif heading:
                f.categories.append(Vote(heading[0], lno, 2))
            if cells.get("source"):
                f.sources.append(Vote(strip_markup(cells["source"]), lno))
            elif heading:
                f.sources.append(Vote(heading[0], lno, 2))
            if cells.get("module"):
                f.categories.append(Vote(strip_markup(cells["module"]), lno, 3))
            if cells.get("file"):
                if plural:
                    f.categories.append(Vote(strip_markup(cells["file"]), lno, 3))
                else:
                    link = LINK.search(cells["file"])
                    path = clean_path(link.group("href")) if link else clean_path(cells["file"])
                    if "/" in path:
                        f.definitions.append(Site(path, lno, "definition"))
            if cells.get("definition"):
                f.definitions.append(Site(clean_path(cells["definition"]), lno, "definition"))
            for site in sites_in_cell(cells.get("call_sites") or "", None):
                f.call_sites.append(Site(site, lno, "kernel"))
            for site in sites_in_cell(cells.get("op_call_sites") or "", default_file):
                f.call_sites.append(Site(site, lno, "op"))
            for label in op_labels_in_cell(cells.get("ops") or ""):
                f.ops.append(OpRef(label, lno))
            if op_label:
                f.ops.append(OpRef(op_label, lno))
                if "input" in cells or "output" in cells:
                    f.shapes.append(
                        ShapeRow(
                            op_label,
                            cells.get("input", ""),
                            cells.get("output", ""),
                            lno,
                            self.section(),
                            remark,
                        )
                    )

    def file_row(self, cells: dict[str | None, str], cell: str, lno: int, plural: bool) -> None:
        """A "file | <what> kernels" row: the file is named, its kernels are not (triton_data.py)."""
        text = strip_markup(cell)
        path = clean_path(strip_markup(cells.get("file") or ""))
        if plural and path.endswith(".py") and _FILE_OF_KERNELS.search(text):
            self.file_rows.append(FileRow(path, text, lno, self.section()))
            self.formats.add("triton-files")


_FILE_OF_KERNELS = re.compile(r"\bkernels?\b", re.I)


def _frame_site(body: str) -> tuple[str, str | None] | None:
    """`path/x.py:12 Fn()` -> ("path/x.py:12", "Fn"); a body that names no file -> None."""
    tok, _, rest = body.partition(" ")
    if "/" not in tok and not tok.endswith(".py") and not _PATH_LINE.match(tok):
        return None
    via = clean_name(rest) if rest.strip() else None
    return clean_path(tok), via or None
