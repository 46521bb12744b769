# shellcheck shell=bash
# EESSI-like init/bash for hpcstack.ops's tests: EESSI started without its module, as
# EESSI's own init/bash does it. testbed/eessilike.py installs this file, unchanged, as
# <EESSI_PREFIX>/init/bash. The script itself runs archdetect and exports EESSI's variables;
# MODULEPATH gets the software tree with `module use`; no EESSI module is loaded, so nothing
# in Lmod's module table can be unloaded and loaded again to detect anew.
# Sourced from a shell in which `module` is defined.
eessi_like_init=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
export EESSI_PREFIX=${eessi_like_init%/init}
export EESSI_VERSION=${EESSI_PREFIX##*/}
export EESSI_OS_TYPE=linux
eessi_like_subdir=
IFS=: read -r -a eessi_like_archs <<< "$("$eessi_like_init/eessi_archdetect.sh" -a cpupath)"
for eessi_like_arch in "${eessi_like_archs[@]}"; do
    if [ -d "$EESSI_PREFIX/software/linux/$eessi_like_arch/software" ]; then
        eessi_like_subdir=$eessi_like_arch
        break
    fi
done
if [ -z "$eessi_like_subdir" ]; then
    echo "EESSI-like init/bash: no software directory for ${eessi_like_archs[*]}" >&2
    return 1
fi
export EESSI_SOFTWARE_SUBDIR=$eessi_like_subdir
if eessi_like_accel=$("$eessi_like_init/eessi_archdetect.sh" accelpath 2>/dev/null); then
    export EESSI_ACCEL_SUBDIR=${eessi_like_accel##*$'\n'}
fi
export EESSI_CPU_FAMILY=${EESSI_SOFTWARE_SUBDIR%%/*}
export EPREFIX=$EESSI_PREFIX/compat/linux/$EESSI_CPU_FAMILY
export EESSI_EPREFIX=$EPREFIX
export EESSI_SOFTWARE_PATH=$EESSI_PREFIX/software/linux/$EESSI_SOFTWARE_SUBDIR
export LMOD_PACKAGE_PATH=$EESSI_SOFTWARE_PATH/.lmod
export EESSI_MODULEPATH=$EESSI_SOFTWARE_PATH/modules/all
export PATH=$EPREFIX/usr/bin:$EPREFIX/bin:$PATH
module use "$EESSI_MODULEPATH"
unset eessi_like_init eessi_like_subdir eessi_like_archs eessi_like_arch eessi_like_accel
