# shellcheck shell=bash
# A program of the EESSI-like compatibility layer of one CPU family, for hpcstack.ops's
# tests. testbed/eessilike.py writes one per program of <prefix>/compat/linux/<family>/,
# with @FAMILY@, @FOREIGN@ (an ELF file of that family) and @PROGRAM@ (this machine's own
# program) filled in, below the line `#!/bin/bash -p` (eessicompat.SHEBANG): `-p`, no BASH_ENV, no
# functions from the environment.
#
# One machine runs one CPU family, so the compatibility layers of the others are simulated.
# A node is of the family archdetect takes it to be (EESSI_MACHINE_TYPE, else this
# machine's, bash's HOSTTYPE). On a node of its own family the program runs this machine's;
# on a node of another family it ends as the kernel ends a program built for another
# machine: the exec of the ELF file fails with ENOEXEC, and bash says "cannot execute binary
# file: Exec format error" and exits 126. With EESSI_LIKE_COMPAT_RUNLOG set, every start
# appends "<node family> <program's family> <program>" there, the refused ones included.
family=@FAMILY@
node=${EESSI_MACHINE_TYPE:-$HOSTTYPE}
if [ -n "${EESSI_LIKE_COMPAT_RUNLOG:-}" ]; then
    printf '%s %s %s\n' "$node" "$family" "${0##*/}" >>"$EESSI_LIKE_COMPAT_RUNLOG"
fi
if [ "$node" != "$family" ]; then
    exec @FOREIGN@ "$@"
fi
exec -a "$0" @PROGRAM@ "$@"
