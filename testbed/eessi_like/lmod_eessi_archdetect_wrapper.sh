# shellcheck shell=bash
# Sourced by the EESSI-like module through Lmod's source_sh: Lmod records the variable this
# exports in its module table and replays it, instead of sourcing again, while the module
# stays loaded. That replay is what carries one node's CPU detection to another.
# Lmod sources this under `set -e`: a failed detection leaves the variable empty (the
# module reports that) rather than aborting the load without a word.
EESSI_ARCHDETECT_OPTIONS=$("$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/eessi_archdetect.sh" -a cpupath) || true
export EESSI_ARCHDETECT_OPTIONS
