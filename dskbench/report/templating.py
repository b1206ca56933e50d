"""The one Jinja2 environment of dskbench's HTML pages (the report and the pick page).

templates/ holds base.html.j2 (head, header, the shared stylesheet style.css inlined), the pages that
extend it and their partials. Everything a page needs is inlined (CSS, SVG, a few lines of JS), so it
opens offline and fetches nothing.

Templates (*.j2) are indented for reading; the loader drops every line's indentation and line break, so a
page comes out as compact as hand-joined markup (a 3,000-result report stays a few MB). A space that must
separate two pieces of markup is therefore written inside one line. Other files (style.css, report.js)
are inlined verbatim.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from dskbench.report.tables import fmt_num, fmt_pct

TEMPLATES = Path(__file__).resolve().parent / "templates"


class CompactLoader(jinja2.FileSystemLoader):
    """Templates with their indentation and line breaks removed; other files verbatim (never parsed)."""

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        source, filename, uptodate = super().get_source(environment, template)
        if template.endswith(".j2"):
            return "".join(line.strip() for line in source.splitlines()), filename, uptodate
        return "{% raw %}" + source + "{% endraw %}", filename, uptodate


def inline_markup(text: Any) -> Markup:
    """The inline Markdown the text tables carry, as HTML: **bold**, `code`, and a cell that is all *italic*."""
    x = str(escape(str(text)))
    x = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", x)
    x = re.sub(r"`(.+?)`", r"<code>\1</code>", x)
    return Markup(re.sub(r"^\*(.+)\*$", r"<i>\1</i>", x))


def number(x: float) -> str:
    """An axis value as written in a column head: 64, not 64.0."""
    return str(int(x)) if float(x).is_integer() else str(x)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=CompactLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(num=fmt_num, pct=fmt_pct, number=number, inline=inline_markup)
    return env


def render_page(template: str, **context: Any) -> str:
    """One page, ending in a newline."""
    return environment().get_template(template).render(**context) + "\n"
