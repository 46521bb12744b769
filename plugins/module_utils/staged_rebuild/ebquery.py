# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""EasyBuild asked, not told to build: ``--show-config`` and ``--dry-run-short`` before a rebuild.

Such a run reads its configuration and exits, installing nothing, but it still makes
temporary directories and leaves them behind. Each question gets a scratch directory of its
own, removed afterwards, given as ``--tmpdir`` and as ``EASYBUILD_TMPDIR`` and ``TMPDIR``:
EasyBuild makes its first temporary directories while it parses its options, from the
variable (or the site's configuration) and Python's ``TMPDIR``, before ``--tmpdir`` is read.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Callable, List, Mapping, Sequence

from ..common import proc
from ..common.deadline import Deadline, DeadlineExceeded

TIMEOUT = 120


class Unanswered(Exception):
    """EasyBuild could not be run, did not finish, or failed; the message says which, in one line."""


def ask(
    eb: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    question: Callable[[str], List[str]],
    what: str,
) -> proc.ChildResult:
    """Run ``argv`` (an EasyBuild command starting with ``eb``) with the options
    ``question(scratch)`` after it, in ``env`` with the scratch directory as its temporary
    directory; return the finished run. ``what`` names the question in the messages
    (``"eb --show-config"``). Raises ``Unanswered`` when it cannot run, times out, or exits
    non-zero (with EasyBuild's own words, summarised)."""
    scratch = tempfile.mkdtemp(prefix="eb-staged-rebuild-ask-")
    child_env = dict(env, EASYBUILD_TMPDIR=scratch, TMPDIR=scratch)
    try:
        done = proc.run_child(
            [*argv, "--tmpdir=" + scratch, *question(scratch)], env=child_env, deadline=Deadline(TIMEOUT)
        )
    except OSError as err:
        raise Unanswered(f"cannot run {eb}: {err.strerror}") from None
    except DeadlineExceeded:
        raise Unanswered(f"{what} did not finish within {TIMEOUT} s") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise Unanswered(f"{what} failed (exit {done.returncode}): {proc.summary(done.stdout + done.stderr)}")
    return done
