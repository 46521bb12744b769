# shellcheck shell=bash
# Sourced by the EESSI-like module through Lmod's source_sh (see the CPU wrapper). Without a
# GPU, accelpath exits 2 or 3 and prints nothing: the variable is then set and empty.
# Lmod sources this under `set -e`, hence the `|| true`.
EESSI_ACCEL_SUBDIR=$("$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/eessi_archdetect.sh" accelpath) || true
export EESSI_ACCEL_SUBDIR
