"""``targets``: the site file read and refused, ``--target`` chosen, and the archdetect check.

The check runs the repository's stand-in of EESSI's archdetect on a cpuinfo dump of
``testbed/eessi_like/cpuinfo/`` (``EESSI_PROC_CPUINFO``, ``EESSI_MACHINE_TYPE``), never on this
machine's own CPU, which differs from one test machine to the next.
"""

from __future__ import annotations

import os
import textwrap

import pytest

import checkout
from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.common.deadline import Deadline
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import targets

EESSI_LIKE = checkout.REPO / "testbed" / "eessi_like"
ARCHDETECT = EESSI_LIKE / "eessi_archdetect.sh"
ZEN3 = EESSI_LIKE / "cpuinfo" / "x86_64-amd-zen3-epyc-7763.cpuinfo"
ICELAKE = EESSI_LIKE / "cpuinfo" / "x86_64-intel-icelake-xeon-platinum-8358.cpuinfo"

SITE = f"""\
[site]
# run by each job on its node
archdetect = {ARCHDETECT}

[target zen3]
cpu = x86_64/amd/zen3        # what archdetect answers there
installpath = /apps/zen3
constraint = zen3

[target icelake]
cpu = x86_64/intel/icelake
installpath-software = /apps/icelake/sw
installpath-modules = /apps/icelake/mod
state-root = /apps/icelake/state
partition = icelake
"""


def write(tmp_path, text, name="site.ini"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_site_file_gives_each_target_its_trees_state_root_and_slurm_placement(tmp_path):
    site = targets.load(write(tmp_path, SITE))

    assert site.archdetect == str(ARCHDETECT)
    assert list(site.targets) == ["zen3", "icelake"]
    zen3, icelake = site.targets["zen3"], site.targets["icelake"]
    assert (zen3.cpu, zen3.trees.software, zen3.trees.modules) == (
        "x86_64/amd/zen3",
        "/apps/zen3/software",
        "/apps/zen3/modules",
    )
    # The default state root is the one the build_host role gives an installpath.
    assert zen3.state_root == "/apps/zen3/.eb-staged-rebuild"
    assert (zen3.constraint, zen3.partition) == ("zen3", None)
    assert (icelake.trees.software, icelake.trees.modules, icelake.state_root) == (
        "/apps/icelake/sw",
        "/apps/icelake/mod",
        "/apps/icelake/state",
    )
    assert (icelake.constraint, icelake.partition) == (None, "icelake")


def test_the_site_section_is_optional(tmp_path):
    site = targets.load(
        write(tmp_path, "[target a]\ncpu = x86_64/generic\ninstallpath = /a\npartition = p\n")
    )
    assert site.archdetect is None
    assert list(site.targets) == ["a"]


TARGET = "[target zen3]\ncpu = x86_64/amd/zen3\ninstallpath = /apps/zen3\nconstraint = zen3\n"


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        (TARGET + "colour = blue\n", r"\[target zen3\] colour", "unknown key"),
        ("[site]\narchdetect = /a.sh\nbash = /bin/bash\n" + TARGET, r"\[site\] bash", "unknown key"),
        ("[site]\narchdetect = a.sh\n" + TARGET, r"\[site\] archdetect", "not an absolute path"),
        ("[target zen3]\ninstallpath = /apps\nconstraint = zen3\n", r"\[target zen3\] cpu", "missing"),
        (TARGET.replace("x86_64/amd/zen3", "zen 3"), r"\[target zen3\] cpu", "not a CPU target"),
        (TARGET.replace("constraint = zen3\n", ""), r"\[target zen3\] constraint", "missing"),
        (TARGET.replace("constraint = zen3", "partition = a b"), r"\[target zen3\] partition", "not a Slurm"),
        (TARGET.replace("installpath = /apps/zen3\n", ""), r"\[target zen3\] installpath", "missing"),
        (TARGET.replace("/apps/zen3", "apps/zen3"), r"\[target zen3\] installpath", "not an absolute path"),
        (
            TARGET.replace("installpath =", "installpath-software ="),
            r"\[target zen3\] installpath-software",
            "go together",
        ),
        (
            TARGET.replace("installpath =", "installpath-software =") + "installpath-modules = /apps/m\n",
            r"\[target zen3\] state-root",
            "missing",
        ),
        (TARGET.replace("[target zen3]", "[target ../x]"), r"\[target \.\./x\]", "not a plain name"),
        (TARGET.replace("[target zen3]", "[target all]"), r"\[target all\]", "not a plain name"),
        (TARGET.replace("[target zen3]", "[targets zen3]"), r"\[targets zen3\]", "not a section"),
        ("[DEFAULT]\ncpu = x86_64/generic\n" + TARGET, r"\[DEFAULT\]", "not a section"),
        (
            TARGET + TARGET.replace("[target zen3]", "[target zen4]"),
            r"\[target zen4\] state-root",
            "/apps/zen3/.eb-staged-rebuild is also target zen3's",
        ),
        (
            TARGET
            + "[target zen4]\ncpu = x86_64/amd/zen4\ninstallpath-software = /apps/zen3/software\n"
            + "installpath-modules = /apps/zen4/modules\nstate-root = /apps/zen4/state\nconstraint = zen4\n",
            r"\[target zen4\] installpath-software",
            "/apps/zen3/software is also target zen3's",
        ),
    ],
)
def test_a_wrong_site_file_is_refused_in_one_line_naming_file_section_and_key(tmp_path, text, where, what):
    path = write(tmp_path, text)
    with pytest.raises(errors.UsageError, match=rf"^site file {path}, {where}: .*{what}") as refused:
        targets.load(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        (TARGET + TARGET, "section 'target zen3' already exists"),
        (TARGET + "cpu = x86_64/generic\n", "option 'cpu' in section 'target zen3' already exists"),
        ("cpu = x86_64/generic\n", "File contains no section headers"),
        ("[site]\n", "has no \\[target NAME\\] section"),
    ],
)
def test_a_file_that_is_no_site_file_is_refused_in_one_line(tmp_path, text, what):
    path = write(tmp_path, text)
    with pytest.raises(errors.UsageError, match=what) as refused:
        targets.load(path)
    assert "\n" not in str(refused.value)
    assert path in str(refused.value)


def test_a_site_file_that_is_not_a_regular_file_is_not_read(tmp_path):
    fifo = tmp_path / "site.ini"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    with pytest.raises(errors.UsageError, match="is not a regular file"):
        targets.load(str(fifo))
    with pytest.raises(errors.UsageError, match="cannot be read: No such file"):
        targets.load(str(tmp_path / "missing.ini"))


def test_the_site_file_is_the_option_else_the_variable_else_none(tmp_path):
    environ = {targets.TARGETS_VARIABLE: "/etc/site.ini"}
    assert targets.site_file("/other.ini", environ) == "/other.ini"
    assert targets.site_file(None, environ) == "/etc/site.ini"
    assert targets.site_file(None, {}) is None


def test_target_all_is_every_target_in_the_file_s_order(tmp_path):
    site = targets.load(write(tmp_path, SITE))
    assert [target.name for target in targets.select(site, ["all"])] == ["zen3", "icelake"]
    assert [target.name for target in targets.select(site, ["icelake", "zen3"])] == ["icelake", "zen3"]


@pytest.mark.parametrize(
    ("names", "what"),
    [
        (["sapphire"], "--target 'sapphire' is not a target of .* \\(zen3, icelake\\)"),
        (["zen3", "zen3"], "--target zen3 is given twice"),
        (["all", "zen3"], "--target all goes alone"),
    ],
)
def test_a_target_the_site_does_not_have_is_refused(tmp_path, names, what):
    site = targets.load(write(tmp_path, SITE))
    with pytest.raises(errors.UsageError, match=what):
        targets.select(site, names)


def node_env(cpuinfo, **extra):
    """A job's environment on a node whose CPU is ``cpuinfo``, as archdetect reads it."""
    return {
        "PATH": os.environ["PATH"],
        "EESSI_PROC_CPUINFO": str(cpuinfo),
        "EESSI_MACHINE_TYPE": "x86_64",
        "SLURMD_NODENAME": "node7",
        **extra,
    }


def test_a_node_whose_archdetect_agrees_with_the_target_passes(tmp_path):
    site = targets.load(write(tmp_path, SITE))
    assert targets.check_cpu(site, site.targets["zen3"], node_env(ZEN3), Deadline(30)) == "x86_64/amd/zen3"


def test_a_node_of_another_target_is_refused_before_anything_is_built(tmp_path):
    site = targets.load(write(tmp_path, SITE))
    with pytest.raises(errors.PublishError) as refused:
        targets.check_cpu(site, site.targets["zen3"], node_env(ICELAKE), Deadline(30))
    assert str(refused.value) == (
        "this node (node7) is x86_64/intel/icelake, not x86_64/amd/zen3 (target zen3): nothing was built"
    )


def test_archdetect_that_fails_refuses_with_its_reason(tmp_path):
    site = targets.load(write(tmp_path, SITE))
    with pytest.raises(
        errors.PublishError, match=r"this node \(node7\) cannot tell its CPU target: .*cpuinfo"
    ):
        targets.check_cpu(site, site.targets["zen3"], node_env(tmp_path / "none"), Deadline(30))


def test_without_a_site_script_eessi_s_own_is_run(tmp_path):
    site = targets.load(write(tmp_path, SITE.replace(f"archdetect = {ARCHDETECT}\n", "")))
    found = targets.check_cpu(
        site, site.targets["zen3"], node_env(ZEN3, EESSI_INIT_PREFIX=str(EESSI_LIKE)), Deadline(30)
    )
    assert found == "x86_64/amd/zen3"
    with pytest.raises(errors.PublishError, match=r"cannot tell its CPU target: no eessi_archdetect\.sh"):
        targets.check_cpu(site, site.targets["zen3"], node_env(ZEN3), Deadline(30))
