# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""CPU families: the node's, the job's EESSI's, and which of EESSI's programs can run here.

EESSI runs on a compatibility layer per CPU family, ``<EESSI_PREFIX>/compat/linux/<family>``.
Its module takes the family from the target archdetect selected (``x86_64/amd/zen3`` is
``x86_64``) unless ``EESSI_CPU_FAMILY_OVERRIDE`` names one, sets ``EPREFIX``,
``EESSI_EPREFIX`` and ``EESSI_CPU_FAMILY``, and puts ``$EPREFIX/usr/bin`` and ``$EPREFIX/bin``
first on ``PATH``. EESSI's own Lmod lives in a layer too: ``init/lmod/bash`` sources the Lmod
of the layer of ``uname -m``, so ``LMOD_CMD``, and the ``lua`` in its first line, are the
login node's family's. A job carried to a node of another family carries programs that the
kernel refuses there (ENOEXEC, "Exec format error"). The guard starts none of them:

- archdetect and the restore helper run with the job's layer taken off ``PATH``
  (``without_layer``) when it is not of this node's family;
- the Lmod of the layer of this node's family replaces one of another family
  (``lmod_for_node``), at the same place in EESSI's layout, and its ``init/bash`` sets Lmod's
  variables as on a fresh start there;
- the first Lmod call starts as on a fresh start of EESSI (``before_eessi``): without the
  ``LMOD_RC`` files and the ``LMOD_PACKAGE_PATH`` (SitePackage and its hooks) that the job's
  EESSI module added, which Lmod reads when it starts.

Imported only by a task that computes its decision.
"""

from __future__ import annotations

import binascii
import os
import re

# The CPU families EESSI's archdetect knows (its machine types).
FAMILIES = ("x86_64", "aarch64", "riscv64", "ppc64le")
CPU_FAMILY_OVERRIDE = "EESSI_CPU_FAMILY_OVERRIDE"
# A program in a compatibility layer: <...>/compat/linux/<family>/<path in the layer>.
_IN_LAYER = re.compile(r"\A(?P<base>.*/compat/linux/)(?P<family>" + "|".join(FAMILIES) + r")(?P<rest>/.+)\Z")
# What EESSI's module pushes on LMOD_PACKAGE_PATH: Lmod keeps the values under it here,
# base64-encoded, the top first.
_PACKAGE_PATH = "LMOD_PACKAGE_PATH"
_PACKAGE_PATH_STACK = "__LMOD_STACK_LMOD_PACKAGE_PATH"


def node_family(env) -> str:
    """This node's CPU family as EESSI's archdetect takes it: ``EESSI_MACHINE_TYPE``, else
    the kernel's machine type (``uname -m``)."""
    return env.get("EESSI_MACHINE_TYPE") or os.uname().machine


def job_family(env):
    """The family of the job's compatibility layer: ``EESSI_CPU_FAMILY``, else the last
    component of ``EPREFIX``; None when the job's EESSI names none."""
    if env.get("EESSI_CPU_FAMILY"):
        return env["EESSI_CPU_FAMILY"]
    eprefix = env.get("EPREFIX", "").rstrip("/")
    return eprefix.rsplit("/", 1)[-1] or None


def eessi_family(env, target: str) -> str:
    """The family EESSI's module sets on a fresh start for ``target``: the override, else
    the target's first component."""
    return env.get(CPU_FAMILY_OVERRIDE) or target.split("/", 1)[0]


def foreign_layers(env, node: str) -> tuple:
    """The job's compatibility layer (``EPREFIX``, ``EESSI_EPREFIX``) when it is of another
    family than ``node``: none of its programs can run here."""
    if job_family(env) in (None, node):
        return ()
    return tuple(
        {env[name].rstrip("/") for name in ("EPREFIX", "EESSI_EPREFIX") if env.get(name, "").strip("/")}
    )


def without_layer(path: str, layers) -> str:
    """``path`` (a ``PATH``) without the directories in any of ``layers``."""
    if not layers:
        return path
    kept = [entry for entry in path.split(":") if not any(_within(entry, layer) for layer in layers)]
    return ":".join(kept)


def _within(entry: str, layer: str) -> bool:
    entry = entry.rstrip("/")
    return entry == layer or entry.startswith(layer + "/")


def _runnable_path(env, node: str):
    """``env``'s ``PATH`` without the job's layer when that is of another family than
    ``node``; None when it needs no change."""
    layers = foreign_layers(env, node)
    if not layers or "PATH" not in env:
        return None
    return without_layer(env["PATH"], layers)


def runnable(env, node: str) -> dict:
    """A copy of ``env`` whose ``PATH`` leads to no program of another family's layer."""
    copy = dict(env)
    path = _runnable_path(env, node)
    if path is not None:
        copy["PATH"] = path
    return copy


class NodeLmod:
    """The Lmod to reload with: ``command``, and ``init`` (its ``init/bash``) when it
    replaces the job's, of another family; ``missing`` is set instead when this node's
    family has no Lmod where EESSI's layout puts it."""

    __slots__ = ("command", "init", "job_layer", "missing")

    def __init__(self, command: str, init=None, job_layer=None, missing=None) -> None:
        self.command = command
        self.init = init
        self.job_layer = job_layer
        self.missing = missing


def layer_of(program: str):
    """The family of the compatibility layer ``program`` lies in, or None (a site's Lmod,
    one per node at the same path, is of every node's family)."""
    found = _IN_LAYER.match(program)
    return found.group("family") if found else None


def lmod_for_node(lmod_cmd: str, node: str) -> NodeLmod:
    """The Lmod this node can run, given the job's ``LMOD_CMD``.

    In a layer of another family, it is the same program in the layer of ``node``, with
    ``init/bash`` beside its ``libexec/`` (Lmod's layout: ``$LMOD_PKG/libexec/lmod``,
    ``$LMOD_PKG/init/bash``); when that is not there, ``missing`` names what was looked for.
    Anything else is the job's own (whether it runs is ``restore.lmod_command``'s question).
    """
    found = _IN_LAYER.match(lmod_cmd)
    if found is None or found.group("family") == node:
        return NodeLmod(lmod_cmd)
    command = found.group("base") + node + found.group("rest")
    init = os.path.join(os.path.dirname(os.path.dirname(command)), "init", "bash")
    job_layer = found.group("base") + found.group("family")
    if not (os.path.isfile(command) and os.access(command, os.X_OK)):
        return NodeLmod(command, init, job_layer, missing=command)
    if not os.path.isfile(init):
        return NodeLmod(command, init, job_layer, missing=init)
    return NodeLmod(command, init, job_layer)


def before_eessi(env, node: str) -> dict:
    """The settings the first Lmod call starts with, as on a fresh start of EESSI on this
    node: ``{name: value}``, None to unset.

    ``PATH`` without a layer of another family; ``LMOD_RC`` without the ``lmodrc.lua`` files
    of the job's software and site trees; ``LMOD_PACKAGE_PATH`` as it was before the job's
    EESSI module pushed its SitePackage's directory. The unload in that call takes nothing
    from them (Lmod pops and removes what the module recorded), and the load adds this
    node's.
    """
    settings: dict = {}
    path = _runnable_path(env, node)
    if path is not None:
        settings["PATH"] = path
    lmodrc = {
        os.path.join(env[name], ".lmod", "lmodrc.lua")
        for name in ("EESSI_SOFTWARE_PATH", "EESSI_SITE_SOFTWARE_PATH")
        if env.get(name)
    }
    if env.get("LMOD_RC") and lmodrc:
        kept = [entry for entry in env["LMOD_RC"].split(":") if entry not in lmodrc]
        settings["LMOD_RC"] = ":".join(kept) or None
    if env.get("EESSI_SOFTWARE_PATH") and env.get(_PACKAGE_PATH) == os.path.join(
        env["EESSI_SOFTWARE_PATH"], ".lmod"
    ):
        settings[_PACKAGE_PATH] = _pushed_over(env.get(_PACKAGE_PATH_STACK, ""), env[_PACKAGE_PATH])
    return settings


def _pushed_over(stack: str, top: str):
    """The value under ``top`` on Lmod's ``pushenv`` stack, or None when there is none."""
    values = []
    for entry in stack.split(":"):
        try:
            values.append(binascii.a2b_base64(entry.encode("ascii")).decode("utf-8", "surrogateescape"))
        except (ValueError, UnicodeEncodeError):
            return None
    if len(values) < 2 or values[0] != top:
        return None
    return values[1]
