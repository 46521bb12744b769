# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Failure injection for the transaction's guarantees, and the count of its operations.

Every recorded operation of a publish or rollback calls ``Faults.before(operation)`` first.
The default object only counts; a test builds ``Faults(fail_at=n)`` to make the n-th
operation fail with an injected OSError, which the transaction must treat like any real
error: reverse everything done so far, leave every live directory and module file as it
was. Running once with a counting object tells a test how many operations there are.
"""

from __future__ import annotations

import errno


class InjectedFailure(OSError):
    """The error a test asked for: an OSError (EIO) so that it takes the real error paths."""

    def __init__(self, step, path=None):
        super().__init__(errno.EIO, f"injected failure before {step}", path)
        self.step = step


class Faults:
    def __init__(self, fail_at=None):
        self.fail_at = fail_at
        self.operations = []

    def before(self, operation):
        self.operations.append(operation)
        if self.fail_at is not None and len(self.operations) == self.fail_at:
            raise InjectedFailure(operation)
