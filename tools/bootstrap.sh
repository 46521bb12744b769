#!/usr/bin/env bash
# Prepare this machine for `make demo` or `make test`: the distribution packages the real
# components need, and .venv from the pinned requirement files. Safe to re-run: a second run
# only checks and returns.
#
#   tools/bootstrap.sh demo|test
set -euo pipefail

profile=${1:-test}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${HPCSTACK_VENV:-$repo/.venv}
lock=$repo/requirements/dev.txt

say() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: %s\n' "$*" >&2; exit 1; }

# --- distribution packages ---------------------------------------------------------------
# Each package with the reason it is needed; the profile picks the ones it uses.
declare -A why=(
  [lmod]="Lmod loads the module files EasyBuild writes"
  [bubblewrap]="bubblewrap isolates staged builds"
  [munge]="munge authenticates the test Slurm cluster, which the demo starts too"
  [slurmctld]="slurmctld is the test cluster's controller"
  [slurmd]="slurmd runs the test cluster's jobs and TaskProlog, eessi-arch-guard's in the demo"
  [slurm-client]="srun/sbatch/sinfo drive the test cluster"
  [acl]="setfacl/getfacl check that module files keep their ACLs"
  [bindfs]="bindfs gives a real FUSE mount for the rename fallback"
  [shellcheck]="shellcheck lints the shell scripts"
  [locales]="the en_US locale's sources, from which the tests make a strict UTF-8 locale (localedef)"
  [python3-venv]="python3-venv creates .venv"
  [openssh-server]="sshd on every node of the namespace cluster: Ansible reaches the nodes over SSH"
  [openssh-client]="ssh, the connection Ansible uses to the namespace cluster's nodes"
  [glusterfs-server]="glusterd and the brick of the GlusterFS the cluster's build nodes share"
  [glusterfs-client]="the GlusterFS FUSE client each cluster node mounts the shared volume with"
  [ceph-mon]="the monitor of the CephFS the cluster's build nodes share"
  [ceph-osd]="the memstore OSD that holds that CephFS's data"
  [ceph-mds]="the metadata server of that CephFS, which also keeps its locks"
  [ceph-common]="the ceph command that creates that CephFS's pools and filesystem"
  [ceph-fuse]="the CephFS FUSE client each cluster node mounts it with"
  [tcl]="tclsh runs Environment Modules' modulecmd.tcl, the second module tool the tests load module files with"
)
case $profile in
  demo) wanted=(lmod bubblewrap munge slurmctld slurmd slurm-client) ;;
  test)
    wanted=(lmod bubblewrap munge slurmctld slurmd slurm-client acl bindfs shellcheck locales openssh-server
      openssh-client glusterfs-server glusterfs-client ceph-mon ceph-osd ceph-mds ceph-common ceph-fuse tcl) ;;
  *) die "unknown profile '$profile' (expected demo or test)" ;;
esac

# The distribution's interpreter first: .venv must run for every user (the tests build as an
# unprivileged user), and an interpreter under a private home such as /root would not.
default_python=python3
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  default_python=/usr/bin/python3
fi
python=${HPCSTACK_PYTHON:-$default_python}
command -v "$python" >/dev/null || die "no $python on PATH; Python >= 3.11 is needed for .venv"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  die "$python is $("$python" -V 2>&1); ansible-core 2.19 needs Python >= 3.11 (set HPCSTACK_PYTHON)"
if [ ! -x "$venv/bin/python" ] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  wanted+=(python3-venv)
fi

log=$(mktemp)
added_policy=
cleanup() {
  rm -f "$log"
  [ -z "$added_policy" ] || "${as_root[@]}" rm -f /usr/sbin/policy-rc.d
}
trap cleanup EXIT
as_root=()

installed() { dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null | grep -qx installed; }

missing=()
for pkg in "${wanted[@]}"; do
  installed "$pkg" || missing+=("$pkg")
done

if [ ${#missing[@]} -gt 0 ]; then
  reasons=
  for pkg in "${missing[@]}"; do reasons+="${reasons:+; }${why[$pkg]}"; done
  if [ "$(id -u)" -eq 0 ]; then
    :
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    die "missing Debian packages: ${missing[*]} ($reasons). Run as root, or: sudo apt-get install ${missing[*]}"
  fi
  say "installing ${missing[*]} from the distribution: $reasons"
  # The tests start their own daemons; package scripts must not start system-wide ones.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    added_policy=1
    printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${as_root[@]}" chmod 0755 /usr/sbin/policy-rc.d
  fi
  # apt-get update does not honour DPkg::Lock::Timeout: retry while another apt holds the lock.
  for attempt in 1 2 3 4 5 6; do
    "${as_root[@]}" apt-get update -q >"$log" 2>&1 && break
    [ "$attempt" -lt 6 ] || { cat "$log" >&2; die "apt-get update failed"; }
    sleep 5
  done
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    -o DPkg::Lock::Timeout=120 --no-install-recommends "${missing[@]}" >"$log" 2>&1 ||
    { cat "$log" >&2; die "apt-get install ${missing[*]} failed"; }
  for pkg in "${missing[@]}"; do
    installed "$pkg" || die "package $pkg is still not installed after apt-get install"
  done
fi

# --- search permission for the build user -------------------------------------------------
# The tests run .venv's Python and EasyBuild as an unprivileged build user, so every directory
# above the checkout must let others pass (x, not r). A checkout under a private home does not.
if [ "$profile" = test ] && [ "$(id -u)" -eq 0 ]; then
  closed=()
  dir=$repo
  while [ "$dir" != / ]; do
    [ -n "$(find "$dir" -maxdepth 0 -perm -o+x)" ] || closed+=("$dir")
    dir=$(dirname "$dir")
  done
  if [ ${#closed[@]} -gt 0 ]; then
    say "the tests run as an unprivileged user too: adding search permission for others to ${closed[*]}"
    chmod o+x "${closed[@]}"
  fi
fi

# --- .venv --------------------------------------------------------------------------------
# The stamp names the lock file's hash and the interpreter: a changed pin or a new Python
# rebuilds the environment, an unchanged one costs one hash.
stamp_want="$(sha256sum "$lock" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
if ! [ -f "$venv/.bootstrap-stamp" ] || [ "$(cat "$venv/.bootstrap-stamp")" != "$stamp_want" ]; then
  say "creating .venv from requirements/dev.txt (ansible-core, ansible-lint, molecule, EasyBuild, pytest)"
  rm -rf "$venv"
  "$python" -m venv "$venv" >"$log" 2>&1 || { cat "$log" >&2; die "python -m venv failed"; }
  # pip byte-compiles each package after installing it, on one core; compileall then does all
  # of them on every core (-j0): the same .pyc files, in a fifth less time (19 s, not 24). Its
  # status is not checked, as pip's compiling is not: a file no interpreter compiles (a
  # template, a test's data) is imported by no one.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile -r "$lock" >"$log" 2>&1 ||
    { cat "$log" >&2; die "pip install -r requirements/dev.txt failed"; }
  "$venv/bin/python" -m compileall -q -j0 "$venv/lib" >"$log" 2>&1 || true
  printf '%s\n' "$stamp_want" >"$venv/.bootstrap-stamp"
  say ".venv ready ($("$venv/bin/python" -V))"
fi

# --- wheelhouse ---------------------------------------------------------------------------
# The namespace cluster's nodes have no network, and the how-tos run offline: the build_host
# role installs EasyBuild with pip from these wheels (the pinned EasyBuild and setuptools,
# built once; the demo's demo.env names them).
wheelhouse=$venv/wheelhouse
if ! [ -f "$wheelhouse/.complete" ]; then
  pins=$(grep -E '^(easybuild|setuptools)==' "$lock" | cut -d' ' -f1 | tr '\n' ' ')
  say "building the wheelhouse the build_host role installs EasyBuild from: $pins"
  # shellcheck disable=SC2086 # one argument per pin
  "$venv/bin/python" -m pip wheel -q --disable-pip-version-check -w "$wheelhouse" $pins >"$log" 2>&1 ||
    { cat "$log" >&2; die "pip wheel of $pins failed"; }
  touch "$wheelhouse/.complete"
fi

# --- EasyBuild's own test material and a second module tool --------------------------------
# The tests rebuild trees made from what EasyBuild tests itself with: the test/framework/ of
# its source distribution (the toy easyconfigs, the sandbox's sources and easyblocks), of the
# pinned version. Environment Modules 5 loads the results beside Lmod; its Debian package
# conflicts with lmod, so it is unpacked here, not installed, and run with the system's tclsh.
material=$venv/test-material
if [ "$profile" = test ] && ! [ -f "$material/.complete" ]; then
  framework=$(grep -E '^easybuild-framework==' "$lock" | cut -d' ' -f1)
  say "fetching EasyBuild's test material ($framework source distribution) and Environment Modules"
  rm -rf "$material"
  mkdir -p "$material/download"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$material/download" "$framework" >"$log" 2>&1 || { cat "$log" >&2; die "pip download of $framework failed"; }
  mkdir "$material/easybuild-framework"
  tar -xzf "$material"/download/easybuild_framework-*.tar.gz -C "$material/easybuild-framework" \
    --strip-components=1
  # apt-get download needs the package lists; a machine that had every package may have none.
  if ! (cd "$material/download" && apt-get download environment-modules) >"$log" 2>&1; then
    "${as_root[@]}" apt-get update -q >"$log" 2>&1 || true
    (cd "$material/download" && apt-get download environment-modules) >"$log" 2>&1 ||
      { cat "$log" >&2; die "apt-get download environment-modules failed"; }
  fi
  dpkg -x "$material"/download/environment-modules_*.deb "$material/environment-modules"
  [ -n "$(find "$material/environment-modules" -name modulecmd.tcl -print -quit)" ] ||
    die "the environment-modules package has no modulecmd.tcl"
  # The tests build as an unprivileged user too.
  chmod -R a+rX "$material"
  touch "$material/.complete"
fi
