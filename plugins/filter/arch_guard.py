# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The arch_guard role's decisions, on the controller: the play's variables in, the pure
functions of ``module_utils/arch_guard_role/plan.py`` called, plain data out."""

from __future__ import annotations

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import plan


def _facts(result):
    """A registered module result, or None when the task did not run (skipped, or not yet)."""
    if not result or result.get("skipped"):
        return None
    return result


def arch_guard_fleet(settings, host, identities, node_name):
    """``plan.fleet``: the layout, the owner and the layout's refusals for ``host``."""
    return plan.fleet(plan.Settings(settings), host, [tuple(pair) for pair in identities], node_name)


def arch_guard_plan(inputs):
    """``plan.node``: what the role does on one host, from what the play knows so far."""
    survey = _facts(inputs.get("survey"))
    again = _facts(inputs.get("python_again"))
    if survey is not None and again is not None:
        # The interpreters as the survey after installing the distribution's Python found them.
        survey = dict(survey, python=again["python"])
    return plan.node(
        plan.Settings(inputs["settings"]),
        inputs["host"],
        survey_facts=survey,
        fleet_facts=inputs.get("fleet") or None,
        owner_facts=_facts(inputs.get("owner")),
        prologs=_facts(inputs.get("prologs")),
        code=inputs.get("code") or None,
        play_nodes=inputs.get("play_nodes"),
    )


class FilterModule:
    def filters(self):
        return {"arch_guard_fleet": arch_guard_fleet, "arch_guard_plan": arch_guard_plan}
