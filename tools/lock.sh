#!/usr/bin/env bash
# Resolve requirements/dev.in (the direct pins) into requirements/dev.txt (every package,
# pinned) in a throw-away venv, so .venv is the same on every machine.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${HPCSTACK_PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -r "$repo/requirements/dev.in"
{
  echo "# Full pin set for .venv, resolved from requirements/dev.in (the direct pins)."
  echo "# Regenerate with \`make lock\` after changing dev.in."
  "$tmp/venv/bin/python" -m pip freeze --all --disable-pip-version-check | grep -v '^pip==' | sort -f
} >"$repo/requirements/dev.txt"
echo "lock: wrote requirements/dev.txt ($(grep -vc '^#' "$repo/requirements/dev.txt") packages)"
