#!/usr/bin/env bash
# Stand-in for EESSI's init/eessi_archdetect.sh, written for hpcstack.ops's tests and demo.
# Same command line, inputs, answers and exit codes as the real one; its own CPU tables
# (arch_specs/<machine>, next to this script).
#
#   eessi_archdetect.sh [-d] [-a] cpupath|accelpath
#
#   cpupath        best CPU target for this host, e.g. x86_64/intel/icelake
#   -a cpupath     every compatible target, most specific first, joined by ':', ending in
#                  <machine>/generic
#   accelpath      accel/nvidia/ccNN from the first GPU nvidia-smi reports
#   -d             explain the decision on stderr
#
# Inputs: EESSI_PROC_CPUINFO (default /proc/cpuinfo), EESSI_MACHINE_TYPE (default uname -m),
# EESSI_SOFTWARE_SUBDIR_OVERRIDE (cpupath answers it without looking at the CPU),
# EESSI_ACCELERATOR_TARGET_OVERRIDE (accelpath answers it, if well formed).
# For tests: with EESSI_ARCHDETECT_STANDIN_RUNLOG set, each run appends "<pid> <args>" there.
#
# Exit status: 0 answer printed; 1 any error (bad usage, unsupported machine type, cpuinfo
# not readable, malformed override); accelpath only: 2 no nvidia-smi on PATH, 3 nvidia-smi
# failed or reported no usable compute capability.

if [ -z "${BASH_VERSINFO[0]:-}" ] || [ "${BASH_VERSINFO[0]}" -lt 4 ]; then
    echo "eessi_archdetect.sh: needs bash >= 4" >&2
    exit 1
fi
set -o nounset -o pipefail

USAGE="usage: eessi_archdetect.sh [-d] [-a] cpupath|accelpath"
SPEC_DIR=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/arch_specs
ACCEL_PATTERN='^accel/(nvidia/cc[0-9]+|amd/gfx[0-9a-f]+)$'
debug=0
all_targets=0

say_debug() {
    if [ "$debug" = 1 ]; then
        printf 'eessi_archdetect: %s\n' "$*" >&2
    fi
}

die() {
    printf 'eessi_archdetect: %s\n' "$*" >&2
    exit 1
}

record_run() {
    # A test counts runs to prove that Lmod reused a recorded answer instead of asking again.
    [ -n "${EESSI_ARCHDETECT_STANDIN_RUNLOG:-}" ] || return 0
    printf '%s %s\n' "$$" "$*" >>"$EESSI_ARCHDETECT_STANDIN_RUNLOG" ||
        die "cannot append to run log $EESSI_ARCHDETECT_STANDIN_RUNLOG"
}

declare -A cpu_field=()

read_cpuinfo() {
    # Keys are compared lower-cased with blanks as '_', so /proc/cpuinfo ("vendor_id",
    # "CPU implementer") and lscpu dumps ("Vendor ID", "Flags") read alike. The last
    # processor's value wins, as every processor of a node reports the same.
    local file=$1 line key value
    if ! [ -f "$file" ] || ! [ -r "$file" ]; then
        die "cannot read cpuinfo $file"
    fi
    while IFS= read -r line || [ -n "$line" ]; do
        [[ $line == *:* ]] || continue
        key=${line%%:*}
        value=${line#*:}
        key=${key//$'\t'/ }
        key=${key%"${key##*[! ]}"}
        key=${key,,}
        value=${value#"${value%%[! $'\t']*}"}
        cpu_field[${key// /_}]=$value
    done <"$file"
}

field() {
    # First non-empty field among the names given.
    local name
    for name in "$@"; do
        if [ -n "${cpu_field[$name]:-}" ]; then
            printf '%s' "${cpu_field[$name]}"
            return 0
        fi
    done
}

declare -a spec_target=() spec_vendor=() spec_flags=()
declare -A flags_of=()

read_specs() {
    # One target per line, least specific first: "<target> <vendor> <token>...", where a
    # token is a flag the CPU must report or "@<target>" for every flag of an earlier line.
    local file=$1 line target vendor token flags
    local -a words
    [ -f "$file" ] || die "no CPU table $file"
    while IFS= read -r line || [ -n "$line" ]; do
        line=${line%%#*}
        read -r -a words <<<"$line"
        [ "${#words[@]}" -ge 2 ] || continue
        target=${words[0]}
        vendor=${words[1],,}
        flags=""
        for token in "${words[@]:2}"; do
            if [[ $token == @* ]]; then
                [ -n "${flags_of[${token#@}]+set}" ] || die "$file: $target refers to unknown ${token#@}"
                flags+=" ${flags_of[${token#@}]}"
            else
                flags+=" $token"
            fi
        done
        flags_of[$target]=$flags
        spec_target+=("$target")
        spec_vendor+=("$vendor")
        spec_flags+=("$flags")
    done <"$file"
}

cpupath() {
    if [ -n "${EESSI_SOFTWARE_SUBDIR_OVERRIDE:-}" ]; then
        say_debug "EESSI_SOFTWARE_SUBDIR_OVERRIDE=$EESSI_SOFTWARE_SUBDIR_OVERRIDE"
        printf '%s\n' "$EESSI_SOFTWARE_SUBDIR_OVERRIDE"
        return 0
    fi
    local machine=${EESSI_MACHINE_TYPE:-$(uname -m)}
    local cpuinfo=${EESSI_PROC_CPUINFO:-/proc/cpuinfo}
    local vendor features
    case $machine in
        x86_64 | aarch64 | riscv64) ;;
        *) die "unsupported machine type '$machine' (this stand-in knows x86_64, aarch64 and riscv64)" ;;
    esac
    read_specs "$SPEC_DIR/$machine"
    read_cpuinfo "$cpuinfo"
    if [ "$machine" = x86_64 ]; then
        vendor=$(field vendor_id)
        features=$(field flags)
    elif [ "$machine" = riscv64 ]; then
        # The kernel names the vendor by its JEDEC code (mvendorid) and reports the ISA as
        # one word, which the table's lines name whole.
        vendor=$(field mvendorid)
        features=$(field isa)
    else
        vendor=$(field cpu_implementer vendor_id)
        features=$(field features flags)
        vendor=${vendor,,}
        # lscpu names Arm Ltd. "ARM"; an implementer the table does not know (Ampere,
        # Apple, ...) still runs Arm's designs' instructions, so its features decide.
        [ "$vendor" = arm ] && vendor=0x41
        [[ " ${spec_vendor[*]} " == *" $vendor "* ]] || vendor=0x41
    fi
    vendor=${vendor,,}
    say_debug "machine=$machine cpuinfo=$cpuinfo vendor='$vendor'"
    say_debug "features: $features"

    local -A have=()
    local flag i ok
    for flag in $features; do
        have[$flag]=1
    done
    local -a matches=()
    for i in "${!spec_target[@]}"; do
        [ "${spec_vendor[$i]}" = "$vendor" ] || continue
        ok=1
        for flag in ${spec_flags[$i]}; do
            if [ -z "${have[$flag]:-}" ]; then
                say_debug "not ${spec_target[$i]}: no $flag"
                ok=0
                break
            fi
        done
        [ "$ok" = 1 ] && matches=("${spec_target[$i]}" "${matches[@]}")
    done
    matches+=("$machine/generic")
    if [ "$all_targets" = 1 ]; then
        local IFS=:
        printf '%s\n' "${matches[*]}"
    else
        printf '%s\n' "${matches[0]}"
    fi
}

accelpath() {
    local override=${EESSI_ACCELERATOR_TARGET_OVERRIDE:-}
    if [ -n "$override" ]; then
        [[ $override =~ $ACCEL_PATTERN ]] ||
            die "EESSI_ACCELERATOR_TARGET_OVERRIDE='$override' is not accel/nvidia/ccNN or accel/amd/gfxNNN"
        printf '%s\n' "$override"
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        say_debug "no nvidia-smi on PATH"
        exit 2
    fi
    local out rc cap
    if [ "$debug" = 1 ]; then
        out=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader </dev/null)
    else
        out=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader </dev/null 2>/dev/null)
    fi
    rc=$?
    if [ "$rc" != 0 ]; then
        say_debug "nvidia-smi failed (exit $rc): $out"
        exit 3
    fi
    cap=${out%%$'\n'*}
    cap=${cap//[[:space:]]/}
    if ! [[ $cap =~ ^[0-9]+\.[0-9]+$ ]]; then
        say_debug "nvidia-smi gave no compute capability: '$out'"
        exit 3
    fi
    printf 'accel/nvidia/cc%s\n' "${cap/./}"
}

main() {
    record_run "$@"
    local opt
    OPTIND=1
    while getopts ':dah' opt; do
        case $opt in
            d) debug=1 ;;
            a) all_targets=1 ;;
            h)
                printf '%s\n' "$USAGE"
                exit 0
                ;;
            *) die "unknown option -$OPTARG; $USAGE" ;;
        esac
    done
    shift $((OPTIND - 1))
    [ $# = 1 ] || die "$USAGE"
    case $1 in
        cpupath) cpupath ;;
        accelpath) accelpath ;;
        *) die "unknown action '$1'; $USAGE" ;;
    esac
}

main "$@"
