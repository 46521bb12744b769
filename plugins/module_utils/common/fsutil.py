# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filesystem primitives shared by the staged rebuild and the guard.

Standard library only; nothing runs at import time.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

# From include/uapi/linux/fs.h.
RENAME_EXCHANGE = 1 << 1
_AT_FDCWD = -100

# renameat2 syscall numbers, for a C library older than glibc 2.28 that lacks the wrapper.
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "ppc64le": 357, "riscv64": 276}

_renameat2_cache = []


def _syscall_renameat2(libc, number):
    """renameat2 through ``syscall(2)``, for a C library that lacks the wrapper."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long

    def renameat2(olddir, old, newdir, new, flags):
        return syscall(
            ctypes.c_long(number),
            ctypes.c_int(olddir),
            ctypes.c_char_p(old),
            ctypes.c_int(newdir),
            ctypes.c_char_p(new),
            ctypes.c_uint(flags),
        )

    return renameat2


def _load_renameat2():
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is not None:
        func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        func.restype = ctypes.c_int
        return func
    number = _SYS_RENAMEAT2.get(platform.machine())
    return None if number is None else _syscall_renameat2(libc, number)


def _renameat2():
    """The renameat2 callable (or None), loaded on first use rather than at import."""
    if not _renameat2_cache:
        _renameat2_cache.append(_load_renameat2())
    return _renameat2_cache[0]


def rename_exchange(path_a, path_b):
    """Swap the names ``path_a`` and ``path_b`` in one step (``renameat2(RENAME_EXCHANGE)``).

    Both names must exist. Raises ``OSError`` with the kernel's errno: ``EXDEV`` across
    mounts, ``EINVAL`` where the filesystem cannot exchange (FUSE, overlay lower layers),
    ``ENOSYS`` where neither the C library nor the syscall table offers renameat2. Callers
    pick their fallback from that errno.
    """
    func = _renameat2()
    if func is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path_a, None, path_b)
    if func(_AT_FDCWD, os.fsencode(path_a), _AT_FDCWD, os.fsencode(path_b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path_a, None, path_b)
