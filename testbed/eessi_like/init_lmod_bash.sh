# shellcheck shell=bash
# EESSI-like init/lmod/bash for hpcstack.ops's tests: EESSI started as Lmod's default
# module, as EESSI's own init/lmod/bash does it. testbed/eessilike.py installs this file as
# <root>/init/lmod/bash, with the version it was built for as the default. The EESSI module
# is loaded by `module restore` from LMOD_SYSTEM_DEFAULT_MODULES; a second run (a job that
# inherited the first) resets to the default modules instead of initialising again.
# As EESSI's own script, it sources the Lmod of the compatibility layer of the node's CPU
# family (EESSI's takes `uname -m`; the node here is what archdetect takes it to be,
# EESSI_MACHINE_TYPE, else `uname -m`): LMOD_CMD is that layer's from then on.
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
    eessi_like_family=${EESSI_MACHINE_TYPE:-$(uname -m)}
    # shellcheck disable=SC1090
    . "$eessi_like_root/versions/$EESSI_VERSION/compat/linux/$eessi_like_family/usr/share/Lmod/init/bash" || return 1
    unset eessi_like_family
    module --initial_load --no_redirect restore
else
    module reset
fi
unset eessi_like_root
