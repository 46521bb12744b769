# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which module syntax a staged build writes: the one each live module file already has.

EasyBuild writes a Lua module file as ``<version>.lua`` and a Tcl one as ``<version>``, in
the syntax its configuration says (``--module-syntax``; Lua by default since EasyBuild 5).
Published over a Tcl file, a Lua text would not load (both module tools read a file without
``.lua`` as Tcl and require ``#%Module``), and a ``<version>.lua`` beside the Tcl file would
leave two files for one module, which Lmod and Environment Modules resolve differently. So
a staged rebuild keeps the syntax: the build is told ``--module-syntax`` of the live file,
after the site's own configuration (``EASYBUILD_MODULE_SYNTAX``, configuration files),
which it overrides as it overrides the install paths. A ``--module-syntax`` among the
run's own EasyBuild arguments that asks for the other syntax, or modules of both syntaxes
in one run (EasyBuild writes one syntax per run), are refused before anything is built.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..common import errors

LUA = "Lua"
TCL = "Tcl"
_OPTION = "--module-syntax"


def of_module_file(module_file: str) -> str:
    """The syntax of a module file by its name, as EasyBuild names them: ``.lua`` is Lua."""
    return LUA if module_file.endswith(".lua") else TCL


def requested(eb_args: Sequence[str]) -> Optional[str]:
    """The syntax the run's EasyBuild arguments ask for (the last one given), or None."""
    found = None
    args = list(eb_args)
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith(_OPTION + "="):
            found = arg.split("=", 1)[1]
        elif arg == _OPTION and index + 1 < len(args):
            found = args[index + 1]
    return found


def for_run(modules: Sequence[str], module_files: Sequence[str], eb_args: Sequence[str]) -> str:
    """The one syntax the run's build writes: its live module files'; refuses what cannot be.

    ``modules`` are the run's ``Name/version`` and ``module_files`` their live module files
    (the Lua name where there is none yet), in the same order.
    """
    syntaxes = {of_module_file(path) for path in module_files}
    if len(syntaxes) > 1:
        by_syntax = {
            syntax: next(
                module for module, path in zip(modules, module_files) if of_module_file(path) == syntax
            )
            for syntax in syntaxes
        }
        raise errors.UsageError(
            f"{by_syntax[TCL]} has a Tcl module file and {by_syntax[LUA]} a Lua one; EasyBuild writes "
            "one module syntax per run: rebuild them in separate runs"
        )
    live = syntaxes.pop() if syntaxes else LUA
    asked = requested(eb_args)
    if asked is not None and asked.lower() != live.lower():
        module, path = modules[0], module_files[0]
        raise errors.UsageError(
            f"{module}'s live module file {path} is {live}, and the EasyBuild arguments ask for "
            f"{_OPTION}={asked}: a staged rebuild keeps each module's syntax (give {_OPTION}={live} "
            "or leave the option out)"
        )
    return live


def placement(syntax: str) -> list:
    """The EasyBuild option that makes the build write ``syntax``."""
    return [f"{_OPTION}={syntax}"]
