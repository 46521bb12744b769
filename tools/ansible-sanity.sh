#!/usr/bin/env bash
# Gate: `ansible-test sanity` for this collection, without reaching Galaxy, GitHub or
# ci-files.testing.ansible.com (PyPI serves the sanity tests' own requirements, once).
#
#   tools/ansible-sanity.sh [ansible-test sanity options, e.g. --test pylint]
#
# What it checks is the collection as it ships: the artifact `ansible-galaxy collection
# build` makes (galaxy.yml's build_ignore leaves out tests/, tools/, testbed/, benchmarks/),
# unpacked, with tests/sanity/ (the ignore files) beside it. That is what Galaxy and
# Automation Hub run sanity on. The files that never ship (the tests and the tools that run
# them) are the other gates': ruff's lint and formatting, shellcheck, and pytest, which runs
# them; ansible-test's pylint, pep8 and yamllint over them again cost more than the product's
# own sanity, for rules (Ansible's conventions for plugins) that are not theirs.
#
# ansible-test runs from this project's .venv (the controller, origin): ansible-core is all
# the controller side needs. Every sanity test that has requirements (pylint, pep8,
# yamllint, import, ...) runs in a virtual environment of its own that ansible-test keeps
# under ~/.ansible/test/venv: the first run builds them from PyPI, later runs reuse them
# without any network. (--venv would add a controller environment inside the throw-away
# tree, rebuilt on every run: slower, and it asks PyPI for pip each time.)
# Of the two tests that ansible-test runs once per target Python:
# - `compile` is skipped: the compile gate (tools/compile_check.py) compiles every file of
#   plugins/ on each Python 3.8-3.13, and nothing else ships Python;
# - `import` runs on the oldest and the newest target Python found (3.8 and 3.13): it
#   imports each module and plugin the way Ansible does, in an environment with nothing but
#   ansible-core's own requirements (a module that needs a package the nodes lack fails
#   there), which the compile gate's import of module_utils alone does not. Between the
#   two, a version adds no failure of its own: what Python removes stays removed in the
#   newest, what it adds is missing from the oldest; and the compile gate imports
#   module_utils on every version between.
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
# reads for this ansible-core; line 3 the target Python versions; line 4 the controller's
# (this interpreter's); then one line per pip version ansible-test bootstraps, "<version>
# <cache path of its get-pip script>".
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
print("%d.%d" % sys.version_info[:2])
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
  read -r controller_python
  get_pips=()
  while read -r _pip_version cache_path; do get_pips+=("$cache_path"); done
} <<<"$facts"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hpcstack-sanity.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/ansible_collections/$namespace/$name
source=$tmp/source
mkdir -p "$tree" "$source" "$tmp/bin" "$tmp/dist"

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
[ ${#found[@]} -gt 0 ] || die "no target Python with venv support here"
[ ${#missing[@]} -eq 0 ] ||
  say "WARNING: no Python ${missing[*]} with venv support here"
# The import test's Pythons: the oldest and the newest found (see the top of this file).
import_pythons=("${found[0]}")
[ ${#found[@]} -eq 1 ] || import_pythons+=("${found[-1]}")
say "import test on Python ${import_pythons[*]} (of ${found[*]}); compile: the compile gate's"

# --- the collection tree ----------------------------------------------------------------
# The files git knows (tracked, and untracked ones not ignored; tracked files deleted from
# the work tree are still listed by git: copy what exists), built into the artifact, which
# is unpacked as the tree; then the sanity tests' own ignore files.
(
  cd "$repo"
  git ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' file; do
      if [ -e "$file" ] || [ -L "$file" ]; then printf '%s\0' "$file"; fi
    done |
    tar --null --no-recursion -T - -cf - |
    tar -C "$source" -xf -
)
[ -f "$source/galaxy.yml" ] || die "galaxy.yml did not reach the copy"
"$venv/bin/ansible-galaxy" collection build "$source" --output-path "$tmp/dist" >/dev/null ||
  die "ansible-galaxy collection build failed"
tar -C "$tree" -xzf "$tmp/dist/$namespace-$name-"*.tar.gz
if [ -d "$source/tests/sanity" ]; then
  mkdir -p "$tree/tests"
  cp -R "$source/tests/sanity" "$tree/tests/sanity"
fi
if [ -s "$repo/$ignore_file" ]; then
  say "ignore file in use: $ignore_file ($(grep -cv '^[[:space:]]*\(#\|$\)' "$repo/$ignore_file") entries)"
fi

# --- run ----------------------------------------------------------------------------------
log=$tmp/sanity.log
say "ansible-test sanity in $tree (the built collection)"
set +e
(
  cd "$tree"
  PATH=$tmp/bin:$PATH
  export PATH
  targets=()
  for version in "${import_pythons[@]}"; do targets+=(--target-python "$version"); done
  exec "$venv/bin/ansible-test" sanity --color no --controller "origin:python=$controller_python" \
    "${targets[@]}" --skip-test compile "$@"
) 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# One closing line naming what failed: tools/gates.py shows the last line as the verdict.
runs=$(grep -c '^Running sanity test ' "$log" || true)
tests=$(sed -n 's/^Running sanity test "\([^"]*\)".*/\1/p' "$log" | sort -u | wc -l)
if [ "$status" -eq 0 ]; then
  say "passed: $tests sanity tests ($runs runs: import on Python ${import_pythons[*]})"
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
