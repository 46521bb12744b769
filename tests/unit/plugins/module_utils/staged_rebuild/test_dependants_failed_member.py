"""The member a chain's failed build names (``dependants.failed_member``): EasyBuild's reason
names an easyconfig file, the one given for the named module or a dependant's copy."""

from __future__ import annotations

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import dependants

LIB = dependants.Member(
    "ValLib/1.0", "ValLib/1.0", "/given/ValLib-1.0.eb", ["ValLib/1.0"], dependants.RUNTIME
)
APP = dependants.Member(
    "Compiler/GCC/6.4.0-2.28/ValB/1.0",
    "ValB/1.0-GCC-6.4.0-2.28",
    "/apps/software/ValB/1.0-GCC-6.4.0-2.28/easybuild/ValB-1.0-GCC-6.4.0-2.28.eb",
    ["Compiler/GCC/6.4.0-2.28/ValB/1.0", "ValLib/1.0"],
    dependants.RUNTIME,
)
PLAN = dependants.Plan(target="ValLib/1.0", members=[LIB, APP])


def _reason(easyconfig):
    return (
        f"Installation of {easyconfig} failed: shell command 'false ...' failed with exit code 1 "
        f"in build step for {easyconfig}"
    )


def test_a_dependant_s_copy_named_by_easybuild_is_that_member():
    assert dependants.failed_member(PLAN, _reason("ValB-1.0-GCC-6.4.0-2.28.eb")) is APP


def test_the_easyconfig_given_named_by_easybuild_is_the_named_module():
    assert dependants.failed_member(PLAN, _reason("ValLib-1.0.eb")) is LIB


def test_a_reason_that_names_no_member_s_file_names_no_member():
    assert dependants.failed_member(PLAN, _reason("Other-1.0.eb")) is None
    assert dependants.failed_member(PLAN, "the build sandbox failed") is None
    assert dependants.failed_member(PLAN, None) is None
