#!/usr/bin/env bash
# The test command (set-up included): registry check, lint, and the whole CPU test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
python -m dskbench registry generate --check
ruff check .
ruff format --check .
set +e
python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "test.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$rc"
