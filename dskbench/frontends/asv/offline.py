"""Make asv's published site work without network: point its CDN scripts at vendored copies.

asv 0.6.6's index.html loads jQuery, flot, bootstrap and friends from CDNs; on an offline GPU box or in
CI the page stays blank ("Can not determine continental origin of swallow"). This copies the files in
dskbench/frontends/asv/vendor/ (see SOURCES.md there) into HTML_DIR/vendor/ and rewrites the URLs.

    asv publish && python -m dskbench.frontends.asv.offline results/asv-html
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

VENDOR = Path(__file__).resolve().parent / "vendor"

# asv 0.6.6's external resources -> our copies
CDN_TO_LOCAL = {
    "https://code.jquery.com/jquery-3.3.1.min.js": "jquery-3.3.1.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": "jquery.flot-0.8.3.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": "jquery.flot.time-0.8.3.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": "jquery.flot.selection-0.8.3.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": "jquery.flot.categories-0.8.3.js",
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": "jquery.flot.orderBars-1.0.0.js",
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": "stupidtable-1.1.3.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": "md5-2.19.0.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": "bootstrap-3.1.1.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": "bootstrap-3.1.1.min.css",
}
_TAG = re.compile(r"<(?:script|link)\b[^>]*>")
_URL = re.compile(r'\b(src|href)="(https?://[^"]+)"')
_SRI = re.compile(r'\s+(?:integrity|crossorigin)="[^"]*"')  # the copies are not the CDN's bytes


def make_offline(html_dir: Path) -> tuple[int, list[str]]:
    """Rewrite every page in html_dir; returns (URLs replaced, external resources left as they were)."""
    if not (html_dir / "index.html").is_file():
        raise FileNotFoundError(f"{html_dir}: no index.html (run `asv publish` first)")
    (html_dir / "vendor").mkdir(exist_ok=True)
    for name in set(CDN_TO_LOCAL.values()):
        shutil.copy2(VENDOR / name, html_dir / "vendor" / name)
    replaced, unknown = 0, []

    def swap(tag: re.Match) -> str:
        nonlocal replaced
        text = tag.group(0)
        url = _URL.search(text)
        if url is None:
            return text
        local = CDN_TO_LOCAL.get(url.group(2))
        if local is None:
            unknown.append(url.group(2))
            return text
        replaced += 1
        text = text.replace(url.group(0), f'{url.group(1)}="vendor/{local}"')
        return _SRI.sub("", text)

    for page in sorted(html_dir.glob("*.html")):
        text = page.read_text(encoding="utf-8")
        new = _TAG.sub(swap, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return replaced, sorted(set(unknown))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html_dir", type=Path, help="asv's html_dir (results/asv-html)")
    args = ap.parse_args(argv)
    try:
        replaced, unknown = make_offline(args.html_dir)
    except FileNotFoundError as e:
        print(f"asv_offline: {e}", file=sys.stderr)
        return 2
    print(f"asv_offline: {replaced} CDN resources now served from {args.html_dir / 'vendor'}")
    for url in unknown:  # a newer asv: say which resource still needs network
        print(f"asv_offline: left as is (no vendored copy): {url}", file=sys.stderr)
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
