"""The arch_guard role's decisions, from tables: the layout of a fleet's slurm.conf, the
settings refused, and what the role refuses, installs, writes, skips and puts back on one
host, from what its surveys found.

The layout cases are what a namespace cluster cannot show (NFS, whose device numbers differ
from client to client; hosts cloned from one image; identical per-node copies; hosts without
the file), beside what it shows for real (test_cluster_guard_layouts.py: one file under one
kernel, configless Slurm, a shared file and per-node files at once, a node missing from the
inventory).
"""

from __future__ import annotations

import hashlib

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard import installed
from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import plan, slurmconf
from ansible_collections.hpcstack.ops.plugins.module_utils.common.version import VERSION

SUM = "0" * 64
OTHER_SUM = "1" * 64
NFS = ("nfs4", "filer:/export/slurm")
GLUSTER = ("fuse.glusterfs", "ctl:/vol")
PREFIX = "/opt/hpcstack/arch-guard"
LAUNCHER = f"{PREFIX}/bin/eessi-arch-guard"
WRAPPER = f"{PREFIX}/bin/task-prolog"
CONF = "/etc/slurm/slurm.conf"
STATE_DIR = "/var/lib/hpcstack/arch-guard"
SITE = "/etc/slurm/prolog.sh"
DIGEST = "ab" * 32


def _identity(dev, ino=4242, boot="boot-1", fs=("ext4", "/dev/vda1"), *, sha256=SUM, configless=False):
    return {
        "configless": configless,
        "fstype": fs[0],
        "source": fs[1],
        "dev": dev,
        "ino": ino,
        "boot_id": boot,
        "sha256": sha256,
    }


NO_FILE = {"configless": False, "fstype": None, "source": None, "dev": None, "ino": None}
NO_FILE.update(boot_id=None, sha256=None)

LAYOUTS = {
    # Copies with the same content on each node's own disk: one file each, each edited.
    "identical_copies": ([_identity("254:0"), _identity("254:1"), _identity("254:2")], "per_node"),
    # The same file under one kernel (the namespace cluster's bind mount, containers).
    "one_file": ([_identity("254:0")] * 3, "shared"),
    # Cloned from one image: equal device, inode and content, but other kernels.
    "cloned": ([_identity("254:0", boot=f"boot-{n}") for n in range(3)], "per_node"),
    # NFS: each client numbers the device itself; the source and the inode name the file.
    "nfs": ([_identity(f"0:{50 + n}", boot=f"boot-{n}", fs=NFS) for n in range(3)], "shared"),
    "nfs_alone": ([_identity("0:50", fs=NFS)], "shared"),
    # A FUSE filesystem (GlusterFS, CephFS clients) is one other hosts mount too.
    "fuse": ([_identity(f"0:{60 + n}", boot=f"boot-{n}", fs=GLUSTER) for n in range(2)], "shared"),
    "local_alone": ([_identity("254:0")], "per_node"),
    "mixed": ([_identity("254:0"), _identity("254:0"), _identity("254:2")], "mixed"),
    # Two NFS exports: not one file, and not a file of each host's own either.
    "two_exports": ([_identity("0:50", fs=NFS), _identity("0:51", fs=("nfs4", "filer:/other"))], "mixed"),
    # One host reads the NFS file, another has none: not one file for all.
    "nfs_and_none": ([_identity("0:50", fs=NFS), NO_FILE], "mixed"),
    # The same path, other contents: two files.
    "changed_copy": ([_identity("254:0"), _identity("254:0", sha256=OTHER_SUM)], "per_node"),
    "configless": ([_identity("254:0", configless=True), _identity("254:1")], "configless"),
    # No file anywhere: per_node, and each host is refused by name later (it cannot be read).
    "no_file": ([NO_FILE] * 2, "per_node"),
    "some_without": ([_identity("254:0"), NO_FILE], "per_node"),
}


def _hosts(identities):
    return [(f"n{index}", identity) for index, identity in enumerate(identities)]


@pytest.mark.parametrize("case", LAYOUTS)
def test_the_layout_follows_what_the_hosts_report(case):
    identities, layout = LAYOUTS[case]

    assert plan.auto_layout(_hosts(identities)) == layout


def test_an_owner_named_makes_local_files_one_shared_configuration():
    identities, _layout = LAYOUTS["identical_copies"]

    assert plan.auto_layout(_hosts(identities), slurm_conf_host="ctl") == "shared"


def _settings(**overrides):
    variables = {
        "state": "present",
        "prefix": PREFIX,
        "python": "",
        "python_candidates": ["/usr/bin/python3"],
        "manage_slurm_conf": True,
        "slurm_conf": CONF,
        "slurm_conf_host": "",
        "slurm_conf_layout": "auto",
        "chain_task_prolog": "",
        "state_dir": STATE_DIR,
        "timeout": 60,
        "verbose": False,
        "disabled_partitions": [],
    }
    variables.update(overrides)
    return plan.Settings(variables)


FLEETS = [
    pytest.param({}, "one_file", ("shared", "n0", "", ""), id="shared-first-host-owns"),
    pytest.param({"slurm_conf_host": "ctl"}, "one_file", ("shared", "ctl", "", ""), id="shared-named-owner"),
    pytest.param({}, "identical_copies", ("per_node", "n1", "", ""), id="per-node-each-its-own"),
    pytest.param({"manage_slurm_conf": False}, "mixed", ("per_node", "n1", "", ""), id="not-managed"),
    pytest.param({"slurm_conf_layout": "shared"}, "mixed", ("shared", "n0", "", ""), id="layout-set"),
    pytest.param(
        {},
        "mixed",
        (
            "mixed",
            "n0",
            "the hosts of this play read 2 different slurm.conf, some of them shared (n0, n1; n2)",
            "",
        ),
        id="mixed-refused",
    ),
    pytest.param(
        {},
        "configless",
        ("configless", "n0", "", "slurmd on n0 runs configless (--conf-server)"),
        id="configless-unnamed",
    ),
    pytest.param({"slurm_conf_host": "ctl"}, "configless", ("configless", "ctl", "", ""), id="configless"),
    pytest.param(
        {"slurm_conf_layout": "configless"},
        "identical_copies",
        ("configless", "n0", "", "slurmd on n1 runs configless"),
        id="configless-set-names-the-host",
    ),
]


@pytest.mark.parametrize(("overrides", "case", "expected"), FLEETS)
def test_the_fleet_s_layout_owner_and_refusals(overrides, case, expected):
    layout, owner, mixed, configless = expected

    found = plan.fleet(_settings(**overrides), "n1", _hosts(LAYOUTS[case][0]), "node1")

    assert (found["layout"], found["owner"]) == (layout, owner)
    assert found["one_conf"] == (layout != "per_node")
    assert found["node_name"] == "node1"
    assert mixed in found["refusals"]["mixed"]
    assert bool(mixed) == bool(found["refusals"]["mixed"])
    assert configless in found["refusals"]["configless"]
    assert bool(configless) == bool(found["refusals"]["configless"])


# ------------------------------------------------------------------ the settings


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"prefix": "opt/arch-guard"}, "arch_guard_prefix='opt/arch-guard'"),
        ({"prefix": "/"}, "arch_guard_prefix='/'"),
        ({"prefix": "//"}, "arch_guard_prefix='//'"),
        ({"state_dir": "state"}, "arch_guard_state_dir='state'"),
        ({"python": "python3"}, "arch_guard_python='python3'"),
        ({"python_candidates": ["/usr/bin/python3", "python3"]}, "arch_guard_python_candidates="),
        (
            {"manage_slurm_conf": False, "chain_task_prolog": "site/prolog.sh"},
            "arch_guard_chain_task_prolog=",
        ),
        ({"slurm_conf": "slurm.conf"}, "arch_guard_slurm_conf='slurm.conf'"),
        (
            {"chain_task_prolog": "/bin/true"},
            "arch_guard_manage_slurm_conf=True, arch_guard_chain_task_prolog",
        ),
        ({"timeout": 0}, "arch_guard_timeout=0"),
        ({"timeout": -1}, "arch_guard_timeout=-1"),
        ({"timeout": 90000}, "arch_guard_timeout=90000"),
        ({"timeout": "soon"}, "arch_guard_timeout='soon'"),
        (
            {"slurm_conf_layout": "per_node", "slurm_conf_host": "ctl"},
            "arch_guard_slurm_conf_layout='per_node'",
        ),
    ],
)
def test_settings_the_role_cannot_use_are_named_with_every_rule(overrides, named):
    problem = plan.settings_problem(_settings(**overrides))

    assert problem.startswith("arch_guard: cannot use "), problem
    assert named in problem
    assert "must be absolute paths (the prefix not /)" in problem
    assert "arch_guard_timeout must be more than 0 and at most 86400 seconds" in problem
    assert "arch_guard_chain_task_prolog is for a slurm.conf the role does not own" in problem


@pytest.mark.parametrize(
    "overrides",
    [{}, {"timeout": 86400}, {"timeout": "7"}, {"manage_slurm_conf": "no", "chain_task_prolog": SITE}],
)
def test_settings_the_role_can_use_are_not_refused(overrides):
    assert plan.settings_problem(_settings(**overrides)) is None


@pytest.mark.parametrize(
    ("value", "truth"), [("yes", True), ("True", True), (1, True), ("no", False), ("", False)]
)
def test_booleans_are_read_as_ansible_reads_them(value, truth):
    assert plan.as_bool(value) is truth


# ------------------------------------------------------------------ one host


def _dir(path, uid=0, mode=0o755, gid=0):
    return {"path": path, "type": "directory", "uid": uid, "gid": gid, "mode": mode}


def _parents(*extra):
    return [_dir("/"), _dir("/opt"), _dir("/opt/hpcstack"), *extra]


def _conf(*lines, problem=None, terminated=True):
    return {
        "path": CONF,
        "problem": problem,
        "task_prolog": [{"text": line, "terminated": terminated} for line in lines],
        "slurmd_user": None,
        "identity": _identity("254:0"),
    }


def _state(line=..., stat=True, problem=None, mode=0o700):
    kept = (
        None if line is ... else {"line": line, "slurm_conf": CONF, "text": slurmconf.kept_text(CONF, line)}
    )
    return {
        "parents": [_dir("/"), _dir("/var"), _dir("/var/lib"), _dir("/var/lib/hpcstack")],
        "stat": _dir(STATE_DIR, mode=mode) if stat else None,
        "kept": kept,
        "problem": problem,
    }


def _survey(conf=None, state=None, python=None, *, parents=None, prologs=None, release=None, problems=None):
    return {
        "problems": {"parents": ""} if problems is None else problems,
        "parents": _parents() if parents is None else parents,
        "guard": {},
        "release": release,
        "release_problem": None,
        "state": _state() if state is None else state,
        "slurm_conf": _conf() if conf is None else conf,
        "python": [{"path": "/usr/bin/python3", "version": "3.11.2", "problem": None}]
        if python is None
        else python,
        "prologs": prologs or {},
    }


def _fleet(layout="per_node", owner="n1"):
    return {
        "layout": layout,
        "one_conf": layout != "per_node",
        "owner": owner,
        "node_name": "n1",
        "refusals": {},
    }


def _node(settings=None, survey=None, fleet=None, owner=None, **more):
    return plan.node(
        settings or _settings(),
        "n1",
        survey_facts=_survey() if survey is None else survey,
        fleet_facts=_fleet() if fleet is None else fleet,
        owner_facts=owner,
        **more,
    )


def _executable(path, mode=0o755, kind="file"):
    return {path: {"path": path, "type": kind, "uid": 0, "gid": 0, "mode": mode}}


def test_before_the_survey_only_the_settings_are_decided():
    decided = plan.node(_settings(timeout=0), "n1")

    assert decided["refusals"]["settings"].startswith("arch_guard: cannot use arch_guard_timeout=0")
    assert [name for name, line in decided["refusals"].items() if line] == ["settings"]
    assert decided["candidates"] == ["/usr/bin/python3"]
    assert (decided["python"], decided["build"], decided["keep_line"]) == (None, None, None)


REFUSED = [
    pytest.param(
        {
            "survey": _survey(
                problems={"parents": f"arch_guard: {PREFIX} must be a directory (not a symlink)"}
            )
        },
        "prefix",
        f"arch_guard: {PREFIX} must be a directory (not a symlink)",
        id="the-prefix-check-keeps-its-own-refusal",
    ),
    pytest.param(
        {
            "survey": _survey(
                problems={"parents": "", "first": "arch_guard: one", "second": "arch_guard: two"}
            )
        },
        "node",
        "arch_guard: one",
        id="the-first-of-the-node-s-checks",
    ),
    pytest.param(
        {"survey": _survey(state={**_state(), "parents": [_dir("/"), _dir("/var", mode=0o775)]})},
        "state_dir",
        f"arch_guard: /var must be a directory (not a symlink) owned by root and writable by root alone: the "
        f"guard runs in every job, and whoever can replace {STATE_DIR} runs code in them",
        id="state-dir-under-a-group-writable-directory",
    ),
    pytest.param(
        {
            "survey": _survey(
                python=[
                    {"path": "/usr/bin/python3", "version": "3.6.15", "problem": None},
                    {"path": "/usr/bin/python3.8", "version": None, "problem": "does not run"},
                ]
            )
        },
        "python",
        "arch_guard: no Python 3.8 or newer on n1 for the guard (/usr/bin/python3: 3.6.15; "
        "/usr/bin/python3.8: does not run); set arch_guard_python to one, or arch_guard_python_package",
        id="no-python",
    ),
    pytest.param(
        {"survey": _survey(conf=_conf(problem=f"not a regular file: {CONF}"))},
        "conf",
        f"arch_guard: cannot read {CONF} (not a regular file: {CONF}); the role owns its TaskProlog line",
        id="conf-unreadable",
    ),
    pytest.param(
        {
            "survey": _survey(
                conf=_conf(f"TaskProlog={SITE}", "taskprolog = /other"), prologs=_executable(SITE)
            )
        },
        "lines",
        f"arch_guard: {CONF} has 2 TaskProlog lines; keep one, then run the role again",
        id="two-lines",
    ),
    pytest.param(
        {
            "fleet": _fleet("shared", owner="ctl"),
            "owner": {"slurm_conf": _conf(f"TaskProlog={LAUNCHER}"), "state": _state(), "nodes": ["n1"]},
        },
        "kept",
        f"arch_guard: {CONF} on ctl names the guard as TaskProlog, but {STATE_DIR}/previous-task-prolog.json "
        "is not there, where the line found before the guard's is kept: another host kept it.",
        id="kept-line-elsewhere",
    ),
    pytest.param(
        {"survey": _survey(conf=_conf(f"TaskProlog={LAUNCHER}"), state=_state(problem="not JSON"))},
        "kept",
        f"arch_guard: {CONF} on n1 names the guard as TaskProlog, but the line found before it cannot be "
        "read (not JSON)",
        id="kept-line-unreadable",
    ),
    pytest.param(
        {
            "survey": _survey(
                conf=_conf(f'TaskProlog = "{SITE}" # ours'), prologs=_executable(SITE, mode=0o744)
            )
        },
        "chain",
        f"arch_guard: the TaskProlog to run before the guard, {SITE}, is not an executable file for all "
        "users on n1",
        id="chain-not-executable-for-all",
    ),
    pytest.param(
        {"survey": _survey(conf=_conf(f"TaskProlog={SITE}"), prologs={SITE: None})},
        "chain",
        f"{SITE}, is not an executable file",
        id="chain-missing",
    ),
    pytest.param(
        {"survey": _survey(conf=_conf(f"TaskProlog={SITE}"), prologs=_executable(SITE, kind="directory"))},
        "chain",
        f"{SITE}, is not an executable file",
        id="chain-a-directory",
    ),
    pytest.param(
        {"survey": _survey(conf=_conf("TaskProlog=prolog.sh"), prologs=_executable("prolog.sh"))},
        "chain",
        "the TaskProlog to run before the guard, prolog.sh, is not an executable file",
        id="chain-relative",
    ),
    pytest.param(
        {
            "settings": _settings(manage_slurm_conf=False, chain_task_prolog=SITE),
            "survey": _survey(prologs=_executable(SITE, mode=0o700)),
        },
        "chain",
        f"{SITE}, is not an executable file",
        id="chain-given-not-executable",
    ),
    pytest.param(
        {
            "fleet": _fleet("configless", owner="ctl"),
            "owner": {"slurm_conf": _conf(), "state": _state(), "nodes": ["n1", "n2", "n3"]},
            "play_nodes": ["n1", "n2"],
        },
        ("outside", "not_installed"),
        f"arch_guard: {CONF} on ctl (configless) is the configuration of Slurm nodes that are not in this "
        "play: n3.",
        id="node-missing-from-the-inventory",
    ),
    pytest.param(
        {
            "fleet": _fleet("shared", owner="n1"),
            "owner": {"slurm_conf": _conf(), "state": _state(), "nodes": ["n1", "n2", "n3"]},
            "play_nodes": ["n1"],
        },
        ("not_installed", "outside"),
        f"arch_guard: the guard is not installed on n2, n3, which read {CONF} on n1; its TaskProlog line was "
        "not changed",
        id="nodes-whose-install-failed",
    ),
    pytest.param(
        {
            "settings": _settings(manage_slurm_conf=False, state="absent"),
            "survey": _survey(conf=_conf(f'TaskProlog = "{WRAPPER}" # ours')),
        },
        "still_named",
        f"arch_guard: {CONF} still names the guard as TaskProlog; point it elsewhere",
        id="removal-while-named",
    ),
]


@pytest.mark.parametrize(("inputs", "refusal", "line"), REFUSED)
def test_each_refusal_is_one_line_and_the_only_one(inputs, refusal, line):
    # The two refusals of nodes outside the play are one question, asked before the install
    # and after it (a host whose install failed has left the play); their tasks say which.
    named, *same = refusal if isinstance(refusal, tuple) else (refusal,)

    decided = _node(**inputs)

    refused = {name: text for name, text in decided["refusals"].items() if text}
    assert sorted(refused) == sorted([named, *same]), refused
    assert refused[named].startswith("arch_guard: "), refused[named]
    assert line in refused[named]
    assert "\n" not in refused[named]


def test_a_host_that_refuses_nothing():
    decided = _node()

    assert not any(decided["refusals"].values()), decided["refusals"]


def test_with_a_node_in_the_inventory_for_each_one_slurm_lists_nothing_is_refused():
    owner = {"slurm_conf": _conf(), "state": _state(), "nodes": ["n1", "n2"]}

    decided = _node(fleet=_fleet("shared"), owner=owner, play_nodes=["n2", "n1", "n9"])

    assert (decided["refusals"]["outside"], decided["refusals"]["not_installed"]) == ("", "")


PYTHON = [
    pytest.param(
        [("/usr/bin/python3", "3.6.8"), ("/usr/bin/python3.11", "3.11.2")], "/usr/bin/python3.11", id="later"
    ),
    pytest.param([("/usr/bin/python3", "3.8.0")], "/usr/bin/python3", id="3.8"),
    pytest.param([("/usr/bin/python3", "3.13.1")], "/usr/bin/python3", id="3.13"),
    pytest.param([("/usr/bin/python3", "3.7.17")], None, id="3.7"),
    pytest.param([("/usr/bin/python3", None)], None, id="does-not-run"),
    pytest.param([("/usr/bin/python3", "3.10")], "/usr/bin/python3", id="two-parts"),
]


@pytest.mark.parametrize(("probed", "chosen"), PYTHON)
def test_the_interpreter_is_the_first_candidate_of_3_8_or_newer(probed, chosen):
    python = [
        {"path": path, "version": version, "problem": None if version else "does not run"}
        for path, version in probed
    ]

    decided = _node(survey=_survey(python=python))

    assert decided["python"] == chosen
    assert decided["python_missing"] is (chosen is None)
    assert bool(decided["refusals"]["python"]) is (chosen is None)


def test_an_interpreter_named_is_never_replaced_by_the_distribution_s():
    python = [{"path": "/opt/python/bin/python3", "version": "3.7.1", "problem": None}]

    decided = _node(settings=_settings(python="/opt/python/bin/python3"), survey=_survey(python=python))

    assert decided["candidates"] == ["/opt/python/bin/python3"]
    assert decided["python_missing"] is False
    assert "/opt/python/bin/python3: 3.7.1" in decided["refusals"]["python"]


def test_the_interpreters_found_after_installing_the_distribution_s_python_count():
    before = _survey(python=[{"path": "/usr/bin/python3", "version": "3.6.8", "problem": None}])
    after = [{"path": "/usr/bin/python3", "version": "3.6.8", "problem": None}]
    after.append({"path": "/usr/bin/python3.11", "version": "3.11.9", "problem": None})

    decided = _node(survey=dict(before, python=after))

    assert decided["python"] == "/usr/bin/python3.11"


# What slurm.conf and the kept line say -> the line found before the guard's, the TaskProlog to
# chain, what slurm.conf must name. The launcher's own line and the wrapper's are the guard's.
CHAINS = [
    pytest.param([], ..., None, "", LAUNCHER, id="no-line"),
    pytest.param([f"TaskProlog={SITE}"], ..., f"TaskProlog={SITE}", SITE, WRAPPER, id="site-line"),
    pytest.param(
        [f'TaskProlog = "{SITE}"   # the site\'s own'],
        ...,
        f'TaskProlog = "{SITE}"   # the site\'s own',
        SITE,
        WRAPPER,
        id="site-line-as-written",
    ),
    pytest.param(
        [f"TaskProlog={WRAPPER}"], f"TaskProlog={SITE}", f"TaskProlog={SITE}", SITE, WRAPPER, id="ours-kept"
    ),
    pytest.param([f"TaskProlog={LAUNCHER}"], None, None, "", LAUNCHER, id="ours-none-kept"),
    # The site's own Slurm role put a new line where the guard's was: the new one wins.
    pytest.param(
        ["TaskProlog=/usr/local/new"],
        f"TaskProlog={SITE}",
        "TaskProlog=/usr/local/new",
        "/usr/local/new",
        WRAPPER,
        id="site-replaced-ours",
    ),
]


@pytest.mark.parametrize(("lines", "kept", "previous", "chain", "task_prolog"), CHAINS)
def test_the_task_prolog_to_chain_follows_slurm_conf_and_the_kept_line(
    lines, kept, previous, chain, task_prolog
):
    prologs = {**_executable(SITE), **_executable("/usr/local/new")}

    decided = _node(survey=_survey(conf=_conf(*lines), state=_state(kept), prologs=prologs))

    assert (decided["previous_line"], decided["chain"], decided["task_prolog"]) == (
        previous,
        chain,
        task_prolog,
    )
    assert decided["line"] == f"TaskProlog={task_prolog}"
    assert (decided["wrapper_text"] is not None) is bool(chain)
    assert not any(decided["refusals"].values()), decided["refusals"]


def test_a_task_prolog_only_the_owner_names_is_looked_at_on_each_node():
    owner = {"slurm_conf": _conf(f"TaskProlog={SITE}"), "state": _state(), "nodes": ["n1"]}

    unseen = _node(fleet=_fleet("configless", "ctl"), owner=owner)
    seen = _node(fleet=_fleet("configless", "ctl"), owner=owner, prologs={"prologs": _executable(SITE)})

    assert (unseen["chain"], unseen["chain_unseen"], unseen["refusals"]["chain"]) == (SITE, True, "")
    assert (seen["chain_unseen"], seen["refusals"]["chain"]) == (False, "")


# What is there -> what the role writes; a rerun that finds everything as it leaves it writes nothing.
WRITES = [
    pytest.param(_conf(), _state(), True, True, id="fresh"),
    pytest.param(_conf(f"TaskProlog={LAUNCHER}"), _state(None), False, False, id="as-left"),
    pytest.param(_conf(f"TaskProlog={LAUNCHER}  "), _state(None), True, False, id="blanks-after-the-line"),
    pytest.param(
        _conf(f"TaskProlog={LAUNCHER}", terminated=False), _state(None), True, False, id="no-newline"
    ),
    pytest.param(_conf(f"TaskProlog={LAUNCHER}"), _state(None, mode=0o755), False, True, id="state-dir-mode"),
    pytest.param(_conf(f"TaskProlog={LAUNCHER}"), _state(None, stat=False), False, True, id="state-dir-gone"),
    # A line of the site's replaced the guard's since: it is kept anew, and chained.
    pytest.param(_conf("TaskProlog=/old"), _state("TaskProlog=/older"), True, True, id="site-line-kept-anew"),
    # The kept line is chained now: slurm.conf names the wrapper, the kept line stays.
    pytest.param(
        _conf(f"TaskProlog={LAUNCHER}"), _state("TaskProlog=/old"), True, False, id="kept-line-chained"
    ),
]


@pytest.mark.parametrize(("conf", "state", "set_line", "keep_line"), WRITES)
def test_slurm_conf_and_the_kept_line_are_written_only_when_they_differ(conf, state, set_line, keep_line):
    decided = _node(survey=_survey(conf=conf, state=state, prologs=_executable("/old")))

    assert (decided["set_line"], decided["keep_line"]) == (set_line, keep_line)


def test_the_build_is_installed_when_the_release_records_another():
    code = {"digest": DIGEST, "files": []}
    build = installed.build_name(DIGEST, "/usr/bin/python3")

    fresh = _node(code=code)
    same = _node(survey=_survey(release={"build": build}), code=code)
    other = _node(survey=_survey(release={"build": "0" * 16}), code=code)

    assert fresh["release"] == {
        "version": VERSION,
        "digest": DIGEST,
        "python": "/usr/bin/python3",
        "build": build,
    }
    assert (fresh["install_build"], same["install_build"], other["install_build"]) == (True, False, True)


REMOVALS = [
    pytest.param(
        _conf(f"TaskProlog={WRAPPER}"),
        _state(f"TaskProlog={SITE}"),
        True,
        f"TaskProlog={SITE}",
        True,
        id="put-back",
    ),
    pytest.param(_conf(f"TaskProlog={LAUNCHER}"), _state(None), True, None, True, id="there-was-none"),
    pytest.param(
        _conf(f"TaskProlog={SITE}"), _state(f"TaskProlog={SITE}"), False, None, True, id="site-line-already"
    ),
    pytest.param(_conf(), _state(), False, None, False, id="nothing-kept"),
]


@pytest.mark.parametrize(("conf", "state", "named", "restore", "forget"), REMOVALS)
def test_removal_puts_back_the_kept_line_and_forgets_it(conf, state, named, restore, forget):
    decided = _node(
        settings=_settings(state="absent"), survey=_survey(conf=conf, state=state, prologs=_executable(SITE))
    )

    assert (decided["named"], decided["restore_line"], decided["forget_kept"]) == (named, restore, forget)


@pytest.mark.parametrize(("parents", "there"), [(_parents(_dir(PREFIX)), True), (_parents(), False)])
def test_the_guard_s_files_are_removed_only_when_they_are_there(parents, there):
    assert _node(survey=_survey(parents=parents))["remove_files"] is there


# ------------------------------------------------------------------ what the role writes


def test_the_launcher_runs_the_guard_in_isolated_mode_with_the_site_s_settings():
    settings = _settings(prefix=PREFIX + "/", timeout="7", verbose="yes", disabled_partitions=["debug", 42])

    text = plan.launcher_text(settings, "/usr/bin/python3.11")

    assert text.startswith("#!/usr/bin/python3.11 -IS\n")
    assert f'sys.path.insert(0, "{PREFIX}/lib/current")' in text
    assert "from hpcstack_ops.arch_guard.launcher import run" in text
    assert 'disabled_partitions=["debug", "42"],' in text
    assert "        timeout=7.0,\n        verbose=True,\n" in text
    compile(text, "eessi-arch-guard", "exec")


def test_the_wrapper_runs_the_site_s_prolog_then_the_launcher_quoted():
    text = plan.wrapper_text(_settings(), "/etc/slurm/site prolog.sh")

    assert "\n'/etc/slurm/site prolog.sh'\nstatus=$?\n" in text
    assert f'\n    {LAUNCHER}\nfi\nexit "$status"\n' in text


def _guard_seen(text, **change):
    seen = {"path": WRAPPER, "type": "file", "uid": 0, "gid": 0, "mode": 0o755}
    seen["sha256"] = hashlib.sha256(text.encode()).hexdigest() if text is not None else None
    return {WRAPPER: dict(seen, **change)}


@pytest.mark.parametrize(
    ("chain", "seen", "write"),
    [
        pytest.param(SITE, lambda text: {}, True, id="chained-not-there"),
        pytest.param(SITE, _guard_seen, False, id="chained-as-wanted"),
        pytest.param(SITE, lambda text: _guard_seen(text + "# by hand\n"), True, id="chained-changed"),
        pytest.param(SITE, lambda text: _guard_seen(text, mode=0o775), True, id="chained-mode"),
        pytest.param(SITE, lambda text: _guard_seen(text, type="fifo", sha256=None), True, id="chained-fifo"),
        pytest.param("", lambda text: {}, False, id="unchained-not-there"),
        pytest.param("", lambda text: _guard_seen("#!/bin/sh\n"), True, id="unchained-left-over"),
    ],
)
def test_the_wrapper_is_written_only_when_the_survey_saw_another(chain, seen, write):
    settings = _settings(manage_slurm_conf=False, chain_task_prolog=chain)
    text = plan.wrapper_text(settings, chain) if chain else None
    prologs = {SITE: {"path": SITE, "type": "file", "uid": 0, "gid": 0, "mode": 0o755}}

    decided = plan.node(settings, "n0", survey_facts={"guard": seen(text), "prologs": prologs})

    assert decided["wrapper_text"] == text
    assert decided["write_wrapper"] is write


def test_before_the_survey_the_wrapper_s_step_is_undecided():
    assert (
        plan.node(_settings(manage_slurm_conf=False, chain_task_prolog=SITE), "n0")["write_wrapper"] is None
    )
