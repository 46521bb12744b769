# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure injection for the transaction's guarantees, and the count of its operations.

Every recorded operation of a publish or rollback calls ``Faults.before(operation)`` first.
The default object only counts; a test builds ``Faults(fail_at=n)`` to make the n-th
operation fail with an injected OSError, which the transaction must treat like any real
error: reverse everything done so far, leave every live directory and module file as it
was. Running once with a counting object tells a test how many operations there are.

``Faults(fail_at=n, errno=errno.ENOSPC)`` (or ``EROFS``) makes that error the one a full or
read-only disk gives at that point: the errno and the kernel's words for it
(``os.strerror``), as a real write would raise. Without ``errno`` it is ``EIO``, worded as
an injection.
"""

from __future__ import annotations

import errno as errnos
import os


class InjectedFailure(OSError):
    """The error a test asked for: an OSError (EIO unless told) so that it takes the real error paths."""

    def __init__(self, step, path=None, errno=None):
        if errno is None:
            super().__init__(errnos.EIO, f"injected failure before {step}", path)
        else:
            super().__init__(errno, os.strerror(errno), path)
        self.step = step


class Faults:
    def __init__(self, fail_at=None, errno=None):
        self.fail_at = fail_at
        self.errno = errno
        self.operations = []

    def before(self, operation):
        self.operations.append(operation)
        if self.fail_at is not None and len(self.operations) == self.fail_at:
            raise InjectedFailure(operation, errno=self.errno)
