#!/usr/bin/env bash
# Gate: ansible-lint over the collection with the production profile (.ansible-lint).
#
#   tools/ansible-lint.sh [ansible-lint options or paths]
#
# Offline: .ansible-lint says `offline: true` and --offline repeats it, so nothing is fetched
# from Galaxy (requirements), GitHub (schemas) or PyPI (newer-version check). The collection
# resolves as hpcstack.ops through a temporary ANSIBLE_COLLECTIONS_PATH holding a link to
# this checkout, and ANSIBLE_HOME points into the same temporary directory: ansible-lint
# keeps its collection cache and mocks there and ansible its local temp files, so nothing
# lands in the repository (no .ansible/) and no copy of the collection installed in
# ~/.ansible/collections (molecule's pre-run makes one) can shadow the files under review.
# ansible-lint lints the checkout itself, the files git knows (it honours .gitignore).
# Exit status: 0 when ansible-lint passes, its own non-zero status otherwise.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCSTACK_VENV:-$repo/.venv}

say() { printf 'ansible-lint: %s\n' "$*"; }
die() { printf 'ansible-lint: %s\n' "$*" >&2; exit 2; }

[ -x "$venv/bin/ansible-lint" ] || die "no $venv/bin/ansible-lint; run tools/bootstrap.sh test first"

read -r namespace name < <("$venv/bin/python" - "$repo/galaxy.yml" <<'PY'
import sys

import yaml

with open(sys.argv[1], encoding="utf-8") as handle:
    galaxy = yaml.safe_load(handle)
print(galaxy["namespace"], galaxy["name"])
PY
) || die "could not read namespace and name from galaxy.yml"
[ -n "${name:-}" ] || die "galaxy.yml names no collection"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hpcstack-lint.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/collections/ansible_collections/$namespace" "$tmp/ansible-home"
ln -s "$repo" "$tmp/collections/ansible_collections/$namespace/$name"

export ANSIBLE_COLLECTIONS_PATH=$tmp/collections
export ANSIBLE_HOME=$tmp/ansible-home
export ANSIBLE_LOCAL_TEMP=$tmp/ansible-home/tmp
# yamllint settings come from the repository (or ansible-lint's defaults), never from the
# user's ~/.config/yamllint or $YAMLLINT_CONFIG_FILE.
export XDG_CONFIG_HOME=$tmp/config
unset YAMLLINT_CONFIG_FILE
export PATH=$venv/bin:$PATH

cd "$repo"
set +e
"$venv/bin/ansible-lint" --offline --nocolor "$@"
status=$?
set -e
if [ "$status" -eq 0 ]; then
  say "passed (profile production, $namespace.$name from $ANSIBLE_COLLECTIONS_PATH)"
else
  say "FAILED with exit status $status (rule violations listed above)"
fi
exit "$status"
