#!/usr/bin/env bash
# What asv needs on the GPU box to run at HEAD~1 and HEAD, in well under 1 MB (a `git bundle` of main
# is 14 MB and no longer fits next to the wheel bundle in the 64 MiB a device call carries):
#   .devcarry/asv/git/       a git dir holding only the two commit objects (same hashes; no trees),
#                            shallow at HEAD~1: enough for `asv run --set-commit-hash`, which asks git
#                            for the hash and the commit date only
#   .devcarry/asv/prev.patch HEAD -> HEAD~1 for everything but results/ (git diff --binary)
#   .devcarry/asv/commits    the two hashes, oldest first
# scripts/device_asv_thin.sh uses them there; `asv publish` (which walks the branch) runs here.
#   bash scripts/asv_thin_carry.sh [DEST]        (default .devcarry/asv)
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.devcarry/asv}"
rm -rf "$dest"
mkdir -p "$dest"
git init -q --bare "$dest/git"
for h in $(git rev-parse HEAD^@ HEAD); do  # HEAD and every parent of it (a merge has several)
    git cat-file commit "$h" | git --git-dir "$dest/git" hash-object -t commit -w --stdin >/dev/null
done
git rev-parse HEAD^@ >"$dest/git/shallow"  # their parents are not there: git must not look for them
git --git-dir "$dest/git" update-ref refs/heads/main "$(git rev-parse HEAD)"
git --git-dir "$dest/git" symbolic-ref HEAD refs/heads/main
git diff --binary HEAD HEAD~1 -- . ':(exclude)results' >"$dest/prev.patch"
git rev-parse HEAD~1 HEAD >"$dest/commits"
echo "$dest: $(du -sh "$dest" | cut -f1) for $(tr '\n' ' ' <"$dest/commits")"
