#!/usr/bin/env bash
# Install one SPEC of versions.sh where the running python3 imports it from, and check that it does:
#
#   bash scripts/evidence/install_spec.sh SPEC
#   bash scripts/evidence/install_spec.sh --check SPEC     only the check below, nothing installed
#
# SPEC: one or more pip arguments separated by spaces (NAME==VERSION, wheel files), or a folder: every
# *.whl in it. Without VERSIONS_PIP_TARGET: `python3 -m pip install --no-deps --force-reinstall SPEC`
# into the interpreter's environment. With VERSIONS_PIP_TARGET=DIR (the stack lives in a folder on
# PYTHONPATH, where an install into site-packages would be shadowed): `python3 -m pip install --target DIR
# --upgrade --no-deps SPEC`, after removing DIR's dist-info folders of the same projects (pip's --target
# replaces the package folders but leaves the old version's metadata beside the new one).
# VERSIONS_PIP_ARGS: more pip options, word-split (e.g. `--no-index` on a host without an index).
#
# Then, for every NAME==VERSION or NAME-VERSION-*.whl in SPEC, it prints the version python3 finds
# (importlib.metadata) and where its top-level modules import from, and fails (exit 1) unless that is the
# version asked for, installed where the modules are found (and, with VERSIONS_PIP_TARGET, in that folder).
set -uo pipefail
check_only=0
if [ "${1:-}" = --check ]; then
    check_only=1
    shift
fi
if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: bash scripts/evidence/install_spec.sh [--check] SPEC" >&2
    exit 2
fi
spec="$1"
if [ -d "$spec" ]; then
    shopt -s nullglob
    items=("$spec"/*.whl)
    shopt -u nullglob
    if [ ${#items[@]} -eq 0 ]; then
        echo "install_spec.sh: no *.whl in $spec" >&2
        exit 2
    fi
else
    read -ra items <<<"$spec"
fi
read -ra extra <<<"${VERSIONS_PIP_ARGS:-}"
target="${VERSIONS_PIP_TARGET:-}"

# NAME VERSION per line for the items that say both (a wheel's file name, NAME==VERSION)
wanted="$(python3 - "${items[@]}" <<'EOF'
import os, re, sys
for item in sys.argv[1:]:
    base = os.path.basename(item)
    if base.endswith(".whl"):
        name, version = base.split("-")[:2]
    elif "==" in item:
        name, version = item.split("==", 1)
    else:
        continue
    print(re.sub(r"[-_.]+", "-", name).lower(), version.strip())
EOF
)" || exit 2

if [ "$check_only" = 1 ]; then
    :
elif [ -n "$target" ]; then
    mkdir -p "$target" || exit 1
    while read -r name _; do
        [ -n "$name" ] || continue
        glob="${name//-/_}"
        for d in "$target"/*.dist-info; do
            [ -d "$d" ] || continue
            base="$(basename "$d")"
            norm="$(tr 'A-Z.-' 'a-z__' <<<"${base%%-*}")"
            if [ "$norm" = "$glob" ]; then
                echo "install_spec.sh: removing $d"
                rm -rf "$d"
            fi
        done
    done <<<"$wanted"
    python3 -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$target" \
        ${extra[@]+"${extra[@]}"} "${items[@]}" || exit 1
else
    python3 -m pip install -q --disable-pip-version-check --no-deps --force-reinstall \
        ${extra[@]+"${extra[@]}"} "${items[@]}" || exit 1
fi

python3 - <<EOF
import importlib.metadata as md
import importlib.util
import os
import sys

try:
    from packaging.version import Version
except ImportError:  # compare as text
    Version = str

target = os.path.realpath("$target") if "$target" else ""
bad = 0
for line in """$wanted""".splitlines():
    if not line.strip():
        continue
    name, want = line.split()
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        print(f"install_spec.sh: {name}: not found by python3 after the install", file=sys.stderr)
        bad += 1
        continue
    root = os.path.realpath(str(dist.locate_file("")))
    if target and root != target:
        print(f"install_spec.sh: {name}: python3 finds {dist.version} in {root}, not in {target}", file=sys.stderr)
        bad += 1
    tops = sorted({f.parts[0] for f in dist.files or () if len(f.parts) > 1 and not f.parts[0].endswith((".dist-info", ".data")) and f.parts[0] != ".." and f.suffix in (".py", ".so")})
    where = []
    for top in tops:
        found = importlib.util.find_spec(top)
        origin = (found.submodule_search_locations or [found.origin])[0] if found else None
        where.append(f"{top} from {origin}")
        if origin is None or not os.path.realpath(origin).startswith(root + os.sep):
            print(f"install_spec.sh: {name}: {top} imports from {origin}, not from {root}", file=sys.stderr)
            bad += 1
    ok = Version(dist.version) == Version(want)
    print(f"{name} {dist.version} in {root}" + (f" ({'; '.join(where)})" if where else ""))
    if not ok:
        print(f"install_spec.sh: {name}: python3 finds {dist.version}, not {want}", file=sys.stderr)
        bad += 1
sys.exit(1 if bad else 0)
EOF
