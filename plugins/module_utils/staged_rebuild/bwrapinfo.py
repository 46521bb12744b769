# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check what EasyBuild's bubblewrap mode says it did: ``<generation>/bwrap_info.json``.

EasyBuild (``--experimental --bwrap``) resolves the easyconfigs, writes this file, then runs
itself again under ``bwrap`` with each install directory it will build bind-mounted from the
bubblewrap install path. The file is the only account of where the build wrote. Before the
result is published, every stage root it names must lie inside the run's generation
directory, and so must the software path of its unsandboxed first pass (where it created the
install directories, outside any sandbox) and the source of every ``--bind`` of its ``bwrap``
command (a writable bind of anything else could show a live directory, writable, at another
path inside the sandbox); and EasyBuild must not have built a module that was not requested
(its install would not be published).
"""

from __future__ import annotations

import json
import os

from ..common import errors
from ..common.errors import setting
from . import fsutil, paths

INFO_FILE = "bwrap_info.json"


def _require_in_generation(path, generation, what):
    if not isinstance(path, str) or not os.path.isabs(path):
        raise errors.PublishError(f"bwrap_info.json has no absolute {what}; nothing was swapped")
    real = os.path.realpath(path)
    if not paths.is_inside(real, os.path.realpath(generation)):
        raise errors.PublishError(
            f"bwrap_info.json names {what} {path} outside the generation {generation}; nothing was swapped"
        )


def _binds(command):
    """``(source, destination)`` of every ``--bind`` in the bwrap command; refuse overlays."""
    binds = []
    index = 0
    while index < len(command):
        option = command[index]
        if option.startswith("--overlay"):
            raise errors.PublishError(
                "EasyBuild's bwrap mode used an overlay (it could not create a live install directory); "
                "nothing was swapped"
            )
        if option == "--bind" and index + 2 < len(command):
            binds.append((command[index + 1], command[index + 2]))
            index += 3
            continue
        index += 1
    return binds


def check(generation, requested):
    """Read and check ``bwrap_info.json``; ``requested`` are the run's ``Name/version`` modules."""
    info_path = os.path.join(generation, INFO_FILE)
    try:
        info = json.loads(fsutil.read_regular(info_path, "EasyBuild's bwrap record"))
    except (OSError, ValueError, errors.UsageError) as err:
        raise errors.PublishError(f"cannot read {info_path}: {err}; nothing was swapped") from None
    if not isinstance(info, dict):
        raise errors.PublishError(f"{info_path} holds no JSON object; nothing was swapped")
    for key in (
        "bwrap_installpath",
        "bwrap_installpath_software",
        "bwrap_installpath_modules",
        "installpath_software",
    ):
        _require_in_generation(info.get(key), generation, key)
    unrequested = sorted(set(info.get("modules_to_install") or ()) - set(requested))
    if unrequested:
        raise errors.PublishError(
            f"EasyBuild also built {', '.join(unrequested)}, which was not requested with "
            f"{setting('modules')}; nothing was swapped"
        )
    for source, _destination in _binds(info.get("bwrap_cmd") or ()):
        _require_in_generation(source, generation, "writable bind")
    return info
