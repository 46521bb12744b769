#!/usr/bin/env bash
# Gate: `ansible-test sanity` for this collection, without reaching Galaxy, GitHub or
# ci-files.testing.ansible.com (PyPI serves the sanity tests' own requirements, once).
#
#   tools/ansible-sanity.sh [ansible-test sanity options, e.g. --test pylint]
#
# ansible-test insists on running inside .../ansible_collections/NS/NAME and resolves
# symlinks, so the files git knows (tracked, plus untracked ones that are not ignored) are
# copied into a temporary tree that is removed on exit.
#
# ansible-test runs from this project's .venv (--local): ansible-core is all the controller
# side needs. Every sanity test that has requirements (pylint, pep8, yamllint, import, ...)
# runs in a virtual environment of its own that ansible-test keeps under
# ~/.ansible/test/venv, whatever the mode: the first run builds them from PyPI, later runs
# reuse them without any network. (--venv would add a controller environment inside the
# throw-away tree, rebuilt on every run: slower, and it asks PyPI for pip each time.)
# The multi-version tests (import, compile) run on every target Python that ansible-test
# supports and this machine has: PATH first, then pyenv's versions.
# ansible-test bootstraps pip into new environments with a get-pip script it downloads
# from ci-files.testing.ansible.com; tools/get-pip-standin.py, installed at the cache path
# it looks in, takes its place.
# Exit status: 0 when every test passed, non-zero otherwise.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCSTACK_VENV:-$repo/.venv}
python=$venv/bin/python

say() { printf 'ansible-sanity: %s\n' "$*"; }
die() { printf 'ansible-sanity: %s\n' "$*" >&2; exit 2; }

[ -x "$venv/bin/ansible-test" ] || die "no $venv/bin/ansible-test; run tools/bootstrap.sh test first"
command -v git >/dev/null || die "git is needed to list the collection's files"

# Facts read from ansible-test itself, so an ansible-core upgrade cannot leave them stale:
# line 1 the collection name from galaxy.yml; line 2 the sanity ignore file ansible-test
# reads for this ansible-core; line 3 the target Python versions; then one line per pip
# version ansible-test bootstraps, "<version> <cache path of its get-pip script>".
facts=$("$python" - "$repo/galaxy.yml" <<'EOF'
import os
import sys
import types

import yaml
from ansible_test._internal.constants import SUPPORTED_PYTHON_VERSIONS
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.util import get_ansible_version

with open(sys.argv[1], encoding="utf-8") as handle:
    galaxy = yaml.safe_load(handle)
print("%s %s" % (galaxy["namespace"], galaxy["name"]))
print("tests/sanity/ignore-%s.txt" % ".".join(get_ansible_version().split(".")[:2]))
print(" ".join(SUPPORTED_PYTHON_VERSIONS))
pips = {get_venv_packages(types.SimpleNamespace(version=v))["pip"] for v in SUPPORTED_PYTHON_VERSIONS}
for pip in sorted(pips):
    # The cache path of ansible_test/_util/target/setup/requirements.py:bootstrap().
    print(pip, os.path.expanduser("~/.ansible/test/cache/get_pip_%s.py" % pip.replace(".", "_")))
EOF
) || die "could not read the collection name and ansible-test's settings"
{
  read -r namespace name
  read -r ignore_file
  read -r -a target_pythons
  get_pips=()
  while read -r _pip_version cache_path; do get_pips+=("$cache_path"); done
} <<<"$facts"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hpcstack-sanity.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/ansible_collections/$namespace/$name
mkdir -p "$tree" "$tmp/bin"

# --- the get-pip stand-in ---------------------------------------------------------------
for cache_path in "${get_pips[@]}"; do
  if ! cmp -s "$repo/tools/get-pip-standin.py" "$cache_path"; then
    mkdir -p "$(dirname "$cache_path")"
    cp "$repo/tools/get-pip-standin.py" "$cache_path.standin.$$"
    mv -f "$cache_path.standin.$$" "$cache_path"
    say "installed tools/get-pip-standin.py as $cache_path"
  fi
done

# --- target Pythons ---------------------------------------------------------------------
# ansible-test looks for pythonX.Y on PATH, where a pyenv shim may answer for a version it
# cannot run: the working interpreters (tools/pythons.py) are linked into a private bin
# directory put first on PATH.
found=()
while read -r version interpreter; do
  ln -s "$interpreter" "$tmp/bin/python$version"
  found+=("$version")
done < <("$python" "$repo/tools/pythons.py" --venv "${target_pythons[@]}")
missing=()
for version in "${target_pythons[@]}"; do
  [ -e "$tmp/bin/python$version" ] || missing+=("$version")
done
[ ${#missing[@]} -eq 0 ] ||
  say "WARNING: no Python ${missing[*]} with venv support here; the import and compile tests skip them"
say "target Pythons: ${found[*]}"

# --- the collection tree ----------------------------------------------------------------
# Tracked files deleted from the work tree are still listed by git: copy what exists.
(
  cd "$repo"
  git ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' file; do
      if [ -e "$file" ] || [ -L "$file" ]; then printf '%s\0' "$file"; fi
    done |
    tar --null --no-recursion -T - -cf - |
    tar -C "$tree" -xf -
)
[ -f "$tree/galaxy.yml" ] || die "galaxy.yml did not reach the copy"
if [ -s "$repo/$ignore_file" ]; then
  say "ignore file in use: $ignore_file ($(grep -cv '^[[:space:]]*\(#\|$\)' "$repo/$ignore_file") entries)"
fi

# --- run ----------------------------------------------------------------------------------
log=$tmp/sanity.log
say "ansible-test sanity --local in $tree"
set +e
(
  cd "$tree"
  PATH=$tmp/bin:$PATH
  export PATH
  exec "$venv/bin/ansible-test" sanity --local --color no "$@"
) 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# One closing line naming what failed: tools/gates.py shows the last line as the verdict.
runs=$(grep -c '^Running sanity test ' "$log" || true)
tests=$(sed -n 's/^Running sanity test "\([^"]*\)".*/\1/p' "$log" | sort -u | wc -l)
if [ "$status" -eq 0 ]; then
  say "passed: $tests sanity tests ($runs runs, one per target Python for import and compile)"
  exit 0
fi
# ansible-test ends with "FATAL: The N sanity test(s) listed below (out of M) failed ..."
# followed by one test name per line ("import --python 3.8" for per-Python runs).
failed=$(sed -n '/^FATAL: The [0-9]* sanity test(s) listed below/,/^FATAL: Command /p' "$log" |
  sed -e '1d' -e '/^FATAL: /d' -e '/^$/d' |
  awk '{ key = $1; if (!(key in seen)) { order[++n] = key; seen[key] = "" }
         if ($2 == "--python") seen[key] = seen[key] " " $3 }
       END { for (i = 1; i <= n; i++) { k = order[i]
               printf "%s%s ", k, (seen[k] == "" ? "" : " (Python" seen[k] ")") } }')
if [ -n "$failed" ]; then
  say "FAILED: ${failed% } (of $tests tests; errors above, paths relative to the repository root)"
else
  say "FAILED: ansible-test exited with status $status (see above)"
fi
exit "$status"
