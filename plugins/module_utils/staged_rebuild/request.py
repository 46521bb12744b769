# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One rebuild request: resolved once from the options and the host's variables, checked once.

The command line, the ``staged_rebuild`` module, the dry run and the journal all hold this
one record. ``resolve`` takes the options (keyed by their module names, ``None`` where not
given) and the environment: the install paths as EasyBuild reads them
(``EASYBUILD_INSTALLPATH_SOFTWARE``/``_MODULES`` beat ``EASYBUILD_INSTALLPATH``, an option
beats every variable), ``EB_STAGED_REBUILD_BACKEND`` and ``EB_STAGED_REBUILD_EB``. It then
refuses anything wrong before a file is written: a module that is not NAME/VERSION or not
installed, a run id that is not a plain name or was used, a ledger configuration that does
not parse, an EasyBuild that is not an executable file.

The fields declared with ``settings.option`` are the request's options: the command line's
flags and the module's argument spec are made from them, so an option added here reaches
both. The journal stores the record as it is (``records.dump``); a run resumed after a
crash works from the stored copy.
"""

from __future__ import annotations

import binascii
import dataclasses
import datetime
import os
from typing import Any, List, Mapping, Optional, Set

from ..common import errors
from ..common.errors import setting
from . import dependants, easybuild, ledger, modulefile, naming, paths, settings, syntax
from .backends import BACKENDS
from .ledger import LedgerConfig
from .records import AbsPath
from .settings import option


def new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{binascii.hexlify(os.urandom(3)).decode()}"


@dataclasses.dataclass(frozen=True)
class RebuildRequest:
    """What to rebuild, where, and how; every path absolute."""

    software: AbsPath
    modules: AbsPath
    modules_requested: List[str]
    eb: str
    eb_args: List[str]
    run_id: Optional[str] = option(
        help="the name of the run (a plain name); by default the time and a random suffix"
    )
    backend: str = option(
        "auto",
        help="bwrap, userns, installpath (unsandboxed), or auto: the first of them that works here "
        f"(default: ${settings.BACKEND_VARIABLE}, else auto)",
        variable=settings.BACKEND_VARIABLE,
        choices=BACKENDS,
    )
    skip_live_check: bool = option(
        False, help="skip the check that the live installs did not change during the build"
    )
    allow_unrelocated: bool = option(
        False, help="publish even when binaries still name the build path (installpath backend)"
    )
    prepare: Optional[str] = option(
        help="a shell command run after the build, before the swap; its failure refuses the swap",
        metavar="CMD",
        module=False,
    )
    ledger_config: Optional[AbsPath] = option(  # noqa: RUF009 - option() is dataclasses.field()
        help='a JSON file {"path": "<ledger.jsonl>", "site": "<label>"}: one ledger line per module',
        metavar="FILE",
    )
    with_dependants: bool = option(
        False,
        help="rebuild with the module every installed package built on it, each from its own "
        "easyconfig copy, in one transaction (one --module)",
    )
    exclude: List[str] = option(  # noqa: RUF009 - option() is dataclasses.field()
        [],
        help="with --with-dependants: leave this dependant out (it keeps linking the old build); repeatable",
        metavar="NAME/VERSION",
    )
    lock_timeout: float = 0.0
    # A batch job's run that stops ``staged`` after planning, to be published together with
    # the runs of the other CPU targets (set by the submitting side, no option of its own).
    publish_together: bool = False
    # The ledger configuration as read when the request was made (None: no ledger).
    ledger: Optional[LedgerConfig] = None
    # With --with-dependants: the chain, whose members are ``modules_requested`` in build order.
    chain: Optional[dependants.Plan] = None

    @property
    def trees(self) -> paths.Trees:
        return paths.Trees(self.software, self.modules)

    def module_paths(self, run_id: str) -> List[paths.ModulePaths]:
        """The run's modules as the live tree has them (``naming.locate``)."""
        found = []
        for value in self.modules_requested:
            located = naming.locate(self.trees, value)
            found.append(paths.ModulePaths(self.trees, located.module, located.install_subdir, run_id))
        return found

    def module_syntax(self, run_id: str) -> str:
        """The module syntax the build writes: the live module files' (``syntax.for_run``)."""
        entries = self.module_paths(run_id)
        return syntax.for_run(
            [entry.module for entry in entries], [entry.module_file() for entry in entries], self.eb_args
        )

    def build_order(self, run_id: str) -> List[str]:
        """The run's modules, dependencies first: a chain's plan, else as their live module
        files say (``modulefile.publish_order``); a module without a live module file has none."""
        if self.chain is not None:
            return [member.module for member in self.chain.members]
        texts = {}
        for entry in self.module_paths(run_id):
            try:
                texts[entry.module] = modulefile.read_text(entry.module_file())
            except OSError:
                texts[entry.module] = ""
        return modulefile.publish_order(texts)

    def ledger_settings(self) -> Optional[LedgerConfig]:
        """The ledger this run appends to; read again from its file for a journal that has
        only the file's name (written by a release before the configuration was stored)."""
        if self.ledger is None and self.ledger_config:
            return ledger.load_config(self.ledger_config)
        return self.ledger


def live_trees(values: Mapping[str, Any], environ: Mapping[str, str]) -> paths.Trees:
    """The live software and module roots: the options first, then EasyBuild's variables."""
    software, modules = values.get("installpath_software"), values.get("installpath_modules")
    if software or modules:
        if not (software and modules):
            raise errors.UsageError(
                f"{setting('installpath_software')} and {setting('installpath_modules')} go together"
            )
        return paths.Trees(AbsPath(software), AbsPath(modules))
    if values.get("installpath"):
        return paths.Trees.from_installpath(values["installpath"])
    from_environment = environ.get("EASYBUILD_INSTALLPATH")
    found = []
    for tree in ("software", "modules"):
        path = environ.get("EASYBUILD_INSTALLPATH_" + tree.upper())
        if not path and from_environment:
            path = os.path.join(from_environment, tree)
        if not path:
            raise errors.UsageError(
                f"no install path for {tree}: give {setting('installpath')} DIR "
                "(or set EASYBUILD_INSTALLPATH)"
            )
        found.append(path)
    return paths.Trees(AbsPath(found[0]), AbsPath(found[1]))


TREE_OPTIONS = ("installpath", "installpath_software", "installpath_modules")
TREE_VARIABLES = ("EASYBUILD_INSTALLPATH", "EASYBUILD_INSTALLPATH_SOFTWARE", "EASYBUILD_INSTALLPATH_MODULES")


def configured_trees(values: Mapping[str, Any], environ: Mapping[str, str]) -> Optional[paths.Trees]:
    """The live trees a command acting on journals was given or configured, as ``live_trees``
    resolves them; None when no option and no variable names any (the journals' own count)."""
    if not any(values.get(name) for name in TREE_OPTIONS) and not any(environ.get(v) for v in TREE_VARIABLES):
        return None
    return live_trees(values, environ)


def resolve(values: Mapping[str, Any], environ: Mapping[str, str], eb_args: List[str]) -> RebuildRequest:
    """The request of ``values`` (options by name) and ``environ``, checked against the disk."""
    trees = live_trees(values, environ)
    given = {
        name: settings.from_option_or_environment(name, values, environ, setting)
        for name, (setting, _hint) in settings.options(RebuildRequest).items()
    }
    if given["backend"] not in BACKENDS:
        given_as = (
            f"{setting('backend')} {given['backend']}"
            if values.get("backend")
            else f"{settings.BACKEND_VARIABLE}={given['backend']!r}"
        )
        raise errors.UsageError(f"{given_as} is not one of {', '.join(BACKENDS)}")
    # Only an absent run id is generated: an empty one is a mistake (a variable that expanded to
    # nothing), refused like any other run id that is not a plain name.
    given["run_id"] = run_id = paths.check_run_id(
        new_run_id() if given["run_id"] is None else given["run_id"]
    )
    if given["ledger_config"]:
        given["ledger_config"] = os.path.abspath(given["ledger_config"])
    request = RebuildRequest(
        software=AbsPath(trees.software),
        modules=AbsPath(trees.modules),
        modules_requested=list(values.get("modules") or []),
        eb=settings.eb(values, environ),
        eb_args=list(eb_args),
        lock_timeout=settings.lock_timeout(values),
        ledger=ledger.load_config(given["ledger_config"]) if given["ledger_config"] else None,
        **given,
    )
    _check_chain_options(request)
    _check_modules(request, run_id)
    # The full names from here on: the journal, the output and a resume name the live module
    # the short name meant when the run began.
    request = dataclasses.replace(
        request, modules_requested=[entry.module for entry in request.module_paths(run_id)]
    )
    if request.with_dependants:
        request = with_dependants(request, run_id)
    _check_naming_scheme(request, environ)
    if not os.path.isfile(request.eb) or not os.access(request.eb, os.X_OK):
        raise errors.UsageError(
            f"EasyBuild command {request.eb} is not an executable file "
            f"({setting('eb')}, {settings.EB_VARIABLE})"
        )
    return request


UNSANDBOXED_CHAIN = (
    f"{setting('with_dependants')} needs the bwrap or userns backend: each dependant is built "
    "against the new builds at their live paths, which only a sandbox shows"
)


def _check_chain_options(request: RebuildRequest) -> None:
    """``--with-dependants`` names one module and builds in a sandbox; ``--exclude`` goes with it."""
    if not request.with_dependants:
        if request.exclude:
            raise errors.UsageError(f"{setting('exclude')} goes with {setting('with_dependants')}")
        return
    if len(request.modules_requested) != 1:
        raise errors.UsageError(
            f"{setting('with_dependants')} takes exactly one {setting('modules')} (the package whose "
            f"dependants are rebuilt), not {len(request.modules_requested)}"
        )
    if request.backend == "installpath":
        raise errors.UsageError(f"{UNSANDBOXED_CHAIN} ({setting('backend')} installpath builds elsewhere)")


def target_easyconfig(eb_args: List[str], install_subdir: str) -> str:
    """The easyconfig among EasyBuild's arguments that builds ``install_subdir``: the one named
    as EasyBuild names it (``<Name>-<dir>.eb``), else the only ``.eb`` given, else none ("")."""
    kept, _removed = easybuild.filter_args(eb_args)
    given = [arg for arg in kept if arg.endswith(".eb") and not arg.startswith("-")]
    own = [arg for arg in given if os.path.basename(arg) == install_subdir.replace("/", "-") + ".eb"]
    return (own or given or [""])[0]


def with_dependants(request: RebuildRequest, run_id: str) -> RebuildRequest:
    """The request expanded to its chain: every dependant of its one module, in build order
    (``dependants.plan``), each checked as a module given by name is."""
    entry = request.module_paths(run_id)[0]
    chain = dependants.plan(
        dependants.scan(request.trees),
        entry.module,
        entry.install_subdir,
        target_easyconfig(request.eb_args, entry.install_subdir),
        request.exclude,
    )
    expanded = dataclasses.replace(
        request, modules_requested=[member.module for member in chain.members], chain=chain
    )
    _check_modules(expanded, run_id)
    return expanded


def _check_naming_scheme(request: RebuildRequest, environ: Mapping[str, str]) -> None:
    """Refuse, before anything is built, a module naming scheme the module paths cannot follow,
    and modules whose names are not of the scheme the build uses (``naming.check_scheme``).
    A scheme neither the arguments nor the environment name may come from a configuration
    file: the rebuild asks EasyBuild then (``rebuild.refuse_configured_scheme``)."""
    scheme, given_as = easybuild.naming_scheme(request.eb_args, environ)
    if scheme is not None:
        naming.check_scheme(scheme, f"{given_as}={scheme}", list(request.modules_requested))


def _check_modules(request: RebuildRequest, run_id: str) -> None:
    if not request.modules_requested:
        raise errors.UsageError(f"rebuild needs at least one {setting('modules')} NAME/VERSION")
    seen: Set[str] = set()
    for value, entry in zip(request.modules_requested, request.module_paths(run_id)):
        if entry.module in seen or entry.install_subdir in seen:
            raise errors.UsageError(f"{setting('modules')} {value} is given twice")
        seen.update((entry.module, entry.install_subdir))
        paths.require_live_dir(entry)
        paths.require_module_file_path(entry)
        if os.path.lexists(entry.retired_path):
            raise errors.UsageError(f"{entry.retired_path} exists already; pick another {setting('run_id')}")
    request.module_syntax(run_id)
