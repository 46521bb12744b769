# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decision for a task of a job step: read from the step's cache, or computed under the
step's lock and published for the others.

One deadline covers the lock wait and the computation. SIGTERM becomes an exception from
the start, so that children are killed and work directories removed; once the decision is
finished it is held, so the decision is still published and written out.
"""

from __future__ import annotations

from ..common.deadline import Deadline, hold_sigterm, raise_on_sigterm
from ..common.errors import Terminated
from . import cache, settings
from .decision import TERMINATED, TIMEOUT, is_interrupted


def decision_for(env, mode: str):
    """The decision for a task whose EESSI is loaded and whose guard is on."""
    raise_on_sigterm()
    deadline = Deadline(settings.timeout_seconds(env))
    try:
        path = cache.path_for(env, mode)
        if path is None:
            return _finished(_compute(env, mode, deadline))
        return _through_cache(cache.StepCache(path), env, mode, deadline)
    except Terminated as err:
        return _interrupted(env, TERMINATED, str(err), "was terminated")


def _through_cache(step: cache.StepCache, env, mode: str, deadline: Deadline):
    try:
        step.lock(deadline)
    except cache.Untrusted:
        return _finished(_compute(env, mode, deadline))
    except cache.LockTimeout as err:
        # Whoever held the lock may have finished just now: its result is still good.
        stored = _stored(step)
        if stored is not None:
            return _finished(stored)
        return _interrupted(env, TIMEOUT, str(err), f"gave up after {deadline.seconds:g} s")
    try:
        try:
            stored = step.read()
        except cache.Untrusted:
            # Nothing will be published: holding the lock would only queue the step's tasks.
            step.unlock()
            return _finished(_compute(env, mode, deadline))
        if stored is not None:
            return _finished(stored)
        decision = _finished(_compute(env, mode, deadline))
        if not is_interrupted(decision):
            _publish(step, decision)
        return decision
    finally:
        step.unlock()


def _stored(step: cache.StepCache):
    try:
        return step.read()
    except cache.Untrusted:
        return None


def _publish(step: cache.StepCache, decision) -> None:
    try:  # noqa: SIM105 (contextlib is a slow import on every task's path)
        step.publish(decision)
    except OSError:
        pass  # the step's other tasks compute their own; this one has its answer


def _finished(decision):
    # From here on a SIGTERM waits: the answer is known, and is published and written out.
    hold_sigterm()
    return decision


def _compute(env, mode: str, deadline: Deadline):
    from . import decide  # noqa: PLC0415 (only a task that computes needs Lmod's side)

    return decide.decide(env, mode, deadline)


def _interrupted(env, token: str, detail: str, problem: str):
    from . import decide  # noqa: PLC0415

    return decide.interrupted(env, token, detail, problem)
