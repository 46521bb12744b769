# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where EasyBuild would write, asked before a hierarchical build: refused when not the live module.

Under a hierarchical scheme a module's place depends on more than the easyconfig's name: the
toolchain (``--try-toolchain``, the easyconfig's own) picks the level (``Core``, ``Compiler/GCC/
6.4.0-2.28``) and the install directory's name (``toy/0.0-GCC-6.4.0-2.28``). EasyBuild's dry
run (``--dry-run-short``) of the run's own arguments lists the module each easyconfig makes,
without building; run again under the flat scheme (``--module-naming-scheme=EasyBuildMNS``,
given last, so it wins) it lists their install directories, which both hierarchical schemes
name as the flat scheme does. Both are compared with the live modules before anything is
built. The dry runs install nothing: they get a scratch install path of their own, in the
scratch directory ``ebquery.ask`` gives them.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Sequence

from ..common import errors
from ..common.errors import setting
from . import easybuild, ebquery, naming, paths

# " * [R] $CFGS/toy-0.0-GCC-6.4.0-2.28.eb (module: Compiler/GCC/6.4.0-2.28 | toy/0.0)"; the
# status is x for a module that is installed (not built), and EasyBuild wraps the line at 80
# columns, so the lines are joined first. A wrap keeps the space before it, except after a
# word that fills the 80 columns (a long easyconfig path): there no space is left.
_ENTRY = re.compile(r"\* \[(.)\]\s*(\S+?)\s*\(module: ([^)]*)\)")
_INSTALLED = "x"


def planned_modules(dry_run_text: str) -> Dict[str, str]:
    """``{easyconfig file name: module name}`` of what EasyBuild's dry run says it would build
    (every entry but the installed ones); a hierarchical ``ext | short`` is one name."""
    joined = dry_run_text.replace("\n", "")
    return {
        os.path.basename(easyconfig): "/".join(part.strip() for part in module.split("|"))
        for status, easyconfig, module in _ENTRY.findall(joined)
        if status != _INSTALLED
    }


def _dry_run(argv: List[str], env: Mapping[str, str], eb: str) -> Dict[str, str]:
    def question(scratch: str) -> List[str]:
        return ["--installpath=" + os.path.join(scratch, "install"), "--dry-run-short"]

    try:
        done = ebquery.ask(eb, argv, env, question, "EasyBuild's dry run of this rebuild")
    except ebquery.Unanswered as err:
        raise errors.UsageError(f"{err}; nothing was built") from None
    return planned_modules((done.stdout + done.stderr).decode("utf-8", "replace"))


def check(eb: str, argv: Sequence[str], env: Mapping[str, str], entries: Sequence[paths.ModulePaths]) -> None:
    """Refuse, before the build, a hierarchical run whose EasyBuild would write other module
    files or install directories than the live modules ``entries`` have. ``argv`` is the
    run's EasyBuild command without the install placement (``easybuild.command`` with none)."""
    if all(entry.is_flat for entry in entries):
        return  # the flat scheme's place is the name itself: the request checked it
    modules = _dry_run(list(argv), env, eb)
    wanted = sorted(entry.module for entry in entries)
    if sorted(modules.values()) != wanted:
        said = ", ".join(sorted(modules.values())) or "nothing"
        raise errors.UsageError(
            f"EasyBuild would build {said} (its dry run), not the live {', '.join(wanted)} that "
            f"{setting('modules')} names: give the easyconfigs and toolchain options that build "
            "the live module; nothing was built"
        )
    installs = _dry_run([*argv, "--module-naming-scheme=" + naming.FLAT_SCHEME], env, eb)
    by_module = {module: installs.get(easyconfig) for easyconfig, module in modules.items()}
    for entry in entries:
        subdir = by_module.get(entry.module)
        if subdir != entry.install_subdir:
            raise errors.UsageError(
                f"EasyBuild would install {entry.module} in {entry.trees.software}/{subdir}, but the live "
                f"module's install is {entry.stable_path}; nothing was built"
            )


def command(
    eb: str, user_args: Sequence[str], syntax_placement: Sequence[str], order: Sequence[str]
) -> List[str]:
    """The run's EasyBuild command for the dry runs: as the build's, without install placement."""
    return easybuild.command(eb, list(user_args), list(syntax_placement), order)
