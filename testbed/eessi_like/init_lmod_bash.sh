# shellcheck shell=bash
# EESSI-like init/lmod/bash for hpcstack.ops's tests: EESSI started as Lmod's default
# module, as EESSI's own init/lmod/bash does it. testbed/eessilike.py installs this file as
# <root>/init/lmod/bash, with the version it was built for as the default. The EESSI module
# is loaded by `module restore` from LMOD_SYSTEM_DEFAULT_MODULES; a second run (a job that
# inherited the first) resets to the default modules instead of initialising again.
# EESSI's own script sources the Lmod of its compatibility layer; this prefix has none, so
# it sources the Lmod that the shell's `module` came from ($LMOD_PKG).
eessi_like_root=$(dirname "$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")")
EESSI_VERSION_DEFAULT=${__EESSI_VERSION_USED_FOR_INIT:-@EESSI_VERSION_DEFAULT@}
EESSI_VERSION=${EESSI_VERSION:-$EESSI_VERSION_DEFAULT}
export __EESSI_VERSION_USED_FOR_INIT=${__EESSI_VERSION_USED_FOR_INIT:-$EESSI_VERSION}
export LMOD_SYSTEM_DEFAULT_MODULES=EESSI/$EESSI_VERSION
if [ -z "${__Init_EESSI_Default_Modules:-}" ]; then
    export __Init_EESSI_Default_Modules=1
    module purge > /dev/null 2>&1
    unset __LMOD_REF_COUNT_MODULEPATH _ModuleTable001_
    export MODULEPATH=$eessi_like_root/init/modules
    # shellcheck disable=SC1091
    . "$LMOD_PKG/init/bash"
    module --initial_load --no_redirect restore
else
    module reset
fi
unset eessi_like_root
