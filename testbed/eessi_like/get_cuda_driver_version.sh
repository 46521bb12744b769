# shellcheck shell=bash
# EESSI-like get_cuda_driver_version.sh, for Lmod's source_sh: the CUDA version of this
# node's driver, from nvidia-smi's full report, exported as EESSI_CUDA_DRIVER_VERSION. As
# EESSI's own script, it returns 0 whatever happens (no GPU, no nvidia-smi): the hook that
# sources it decides what a missing answer means.
EESSI_CUDA_DRIVER_VERSION=$(nvidia-smi --query 2>/dev/null | sed -n 's/^CUDA Version *: *\([0-9.]*\).*$/\1/p') || return 0
[ -n "$EESSI_CUDA_DRIVER_VERSION" ] || { unset EESSI_CUDA_DRIVER_VERSION; return 0; }
export EESSI_CUDA_DRIVER_VERSION || return 0
