"""The guard's cold reload across CPU families, beside its floor.

A user started EESSI with ``init/lmod/bash`` on an x86_64 zen3 login node (its Lmod: the
x86_64 compatibility layer's) and loaded two modules; the task runs on an aarch64 grace node
(``EESSI_MACHINE_TYPE`` and a cpuinfo of that CPU: the testbed's compatibility layers refuse
the x86_64 programs there, ``testbed/eessicompat.py``). The cold reload is the step's first
task: both archdetect runs, then the restore helper with the node family's Lmod (its
``init/bash`` sourced, then the unload and the loads).

Its floor is the same work done by hand with the node family's Lmod: one bash with the task's
environment, without the login family's layer on ``PATH``, ``LMOD_RC`` and
``LMOD_PACKAGE_PATH`` (as the guard's first Lmod call starts), that runs EESSI's two
archdetect calls, sources the node family's Lmod ``init/bash``, then one Lmod call that
unloads EESSI and one that loads every module the task had (goal: at most 1.2x); and the
same with the load in two calls, EESSI's module and then the rest, as the guard loads them.
The cache hit's path is unchanged by the families (``bench_guard_latency.py`` measures it
and its imports).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import bench_guard_latency as latency
import checkout
import eessilike
import stackenv
from benchlib import Comparison, Subject

LOGIN = "x86_64/amd/zen3"
NODE = "aarch64/nvidia/grace"
MODULES = ("UserA/1.0", "UserB/2.0")
_FLOOR_START = r"""
archdetect=$EESSI_PREFIX/init/eessi_archdetect.sh
bash "$archdetect" -a cpupath > /dev/null
bash "$archdetect" accelpath > /dev/null
. "$1" > /dev/null 2>&1
shift
eval "$("$LMOD_CMD" bash unload EESSI 2>/dev/null)"
"""
FLOOR_SCRIPT = (
    _FLOOR_START
    + r"""eval "$("$LMOD_CMD" bash load "$@" 2>/dev/null)"
printf '%s' "$EESSI_SOFTWARE_SUBDIR"
"""
)
FLOOR_WITH_HOOKS_SCRIPT = (
    _FLOOR_START
    + r"""eval "$("$LMOD_CMD" bash load "$1" 2>/dev/null)"
eval "$("$LMOD_CMD" bash load "${@:2}" 2>/dev/null)"
printf '%s' "$EESSI_SOFTWARE_SUBDIR"
"""
)


class FamilySite(latency.Site):
    """``latency.Site`` whose mismatched job comes from another family's login node."""

    prefix: eessilike.EessiPrefix


def _login(lmod: stackenv.Lmod, prefix: eessilike.EessiPrefix, target: str) -> dict:
    """``init/lmod/bash`` and the two user modules on a node of ``target``, its variables gone."""
    env = eessilike.login_base(prefix, lmod)
    env.update(eessilike.real_node_env(target))
    loads = " ".join(map(shlex.quote, MODULES))
    ran = eessilike.run_shell(
        lmod, env, f". {shlex.quote(str(prefix.init_lmod_bash))} && module load {loads}"
    )
    if ran.returncode != 0:
        raise latency.BenchError(f"guard_families: the login on {target} failed: {ran.stderr[-500:]}")
    return {name: value for name, value in ran.env.items() if name not in eessilike.NODE_VARIABLES}


def make_site(scratch: Path) -> FamilySite:
    lmod = stackenv.find_lmod()
    prefix = eessilike.build_prefix(scratch / "eessi", targets=(LOGIN, NODE), accel={})
    login, here = _login(lmod, prefix, LOGIN), _login(lmod, prefix, NODE)
    if login["LMOD_CMD"] != str(prefix.layer("x86_64").lmod_cmd):
        raise latency.BenchError(f"guard_families: the login's Lmod is {login['LMOD_CMD']}, not its layer's")
    work = scratch / "rounds"
    work.mkdir()
    site = FamilySite(
        package_root=checkout.link_package(scratch / "pkg"),
        matching=dict(here, **eessilike.real_node_env(NODE), **latency.STEP),
        mismatched=dict(login, **eessilike.real_node_env(NODE), **latency.STEP),
        scratch=work,
    )
    site.prefix = prefix
    return site


def _floor(script: str):
    """One bash running ``script`` as the guard's first Lmod call starts, checked to land on
    the node's target."""

    def factory(_scratch: Path, site: FamilySite):
        modules = site.mismatched["LOADEDMODULES"].split(":")
        if not modules[0].startswith("EESSI/"):
            raise latency.BenchError(f"guard_families: the login loaded {modules[0]} before EESSI")
        layer = site.mismatched["EPREFIX"]
        env = latency._task(site.mismatched, 0, site.scratch)
        env["PATH"] = ":".join(
            entry for entry in env["PATH"].split(":") if entry != layer and not entry.startswith(layer + "/")
        )
        for name in ("LMOD_RC", "LMOD_PACKAGE_PATH"):
            env.pop(name, None)
        init = str(site.prefix.layer("aarch64").lmod_init)
        argv = ["/bin/bash", "--noprofile", "--norc", "-c", script, "floor", init, *modules]
        expected = NODE.encode()

        def floor():
            landed = latency._run(argv, env).stdout
            if landed != expected:
                raise latency.BenchError(f"guard_families: the floor landed on {landed!r}, not {expected!r}")

        return floor

    return factory


cold_reload = latency._cold("families-reload", "mismatched", latency._check_reload)
reload_floor = _floor(FLOOR_SCRIPT)
reload_floor_with_hooks = _floor(FLOOR_WITH_HOOKS_SCRIPT)

CASES = [
    Comparison(
        "guard_families",
        [Subject(f"cold reload zen3 -> grace, across families (goal <= {latency.FLOOR_GOAL})", cold_reload)],
        "the floor: archdetect twice, the node family's Lmod, one unload and one load",
        reload_floor,
        rounds=latency.ROUNDS,
        setup=make_site,
    ),
    Comparison(
        "guard_families",
        [Subject("cold reload zen3 -> grace, across families", cold_reload)],
        "the floor with EESSI's hooks: the load in two calls",
        reload_floor_with_hooks,
        rounds=latency.ROUNDS,
        setup=make_site,
    ),
]
