# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the arch_guard role checks on a node by itself, each check one function: it reads
one fact with the core's primitives and returns that fact with the problem it sees there,
the role's one-line refusal ("" when none).

``survey.survey`` runs each check of ``NODE_CHECKS`` whose input its options hold, and
reports the fact under the check's name and the problem in ``problems`` under the same
name; ``plan.node`` refuses the node for the first problem, and the role fails on that in
one task that names no check (the prefix's refusal keeps its own task: ``OWN_REFUSAL``).
Adding a check is one function here and its line in the table, and its test: no YAML, no
other decision.

What is not here depends on more than the node: whose slurm.conf and kept line count (one
configuration for many nodes is its owner's), whether the interpreter can still come from
the distribution's package, which nodes Slurm lists; those refusals are ``plan.py``'s.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional

from . import trust


class Finding(NamedTuple):
    """What one check read, and the role's one line refusing it ("" when it is as it must be)."""

    fact: Any
    problem: str


def parents(asked: Mapping) -> Optional[Finding]:
    """The directories from ``/`` down to the prefix (``trust.look``), refused when others could
    replace one: every task of every job runs the launcher under it. None without a prefix."""
    prefix = asked.get("prefix")
    if not prefix:
        return None
    chain = trust.look(prefix)
    bad = trust.first_distrusted(chain)
    return Finding(chain, "" if bad is None else trust.refusal(bad[0], prefix))


# Each check by the name its fact and its problem are reported under, in the order they run
# (the first problem is the refusal). A check takes the survey's options, and returns None
# when they hold nothing it reads.
NODE_CHECKS: Dict[str, Callable[[Mapping], Optional[Finding]]] = {
    "parents": parents,
}

# The refusals that keep a task of the role's own, by check: the prefix's is the one an attack
# on a node meets, and sites know it by its task's name. Every other check's problem is the
# refusal ``node``.
OWN_REFUSAL = {"parents": "prefix"}
