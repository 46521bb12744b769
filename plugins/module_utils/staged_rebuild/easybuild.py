# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EasyBuild command of a staged build: the user's arguments, made safe.

Options that could send the build somewhere else than the stage are removed, in both the
``--opt=value`` and ``--opt value`` forms, together with their ``EASYBUILD_*`` environment
equivalents; ``--rebuild`` is added unless the user asked for ``--rebuild`` or ``--force``.

``--prefix`` (``EASYBUILD_PREFIX``) stays: a site that configures EasyBuild by its prefix
finds its sources, build directories and repository there, as with plain ``eb``. What the
prefix would also decide, the install paths (``installpath``, and from it the software,
module and data paths) and the bubblewrap install path, every backend gives explicitly
(``backends.Build.placement_args``), and an explicit option beats the prefix.
"""

from __future__ import annotations

import glob
import os
import re

# Options whose value is a path or a redirection (they take a value).
_REDIRECTING_PREFIXES = ("--installpath", "--subdir-", "--suffix-modules-path", "--bwrap")
# Flags without a value that would touch the live install.
_REDIRECTING_FLAGS = ("--remove-ghost-install-dirs",)
_FORCING = ("--rebuild", "--force", "-f")
# Options among the removed ones that are flags (take no value).
_FLAG_LIKE = ("--bwrap", "--remove-ghost-install-dirs")


# Every long option of EasyBuild 5.4 that the prefixes above stand for.
_REDIRECTING_NAMES = (
    "--installpath",
    "--installpath-data",
    "--installpath-modules",
    "--installpath-software",
    "--subdir-data",
    "--subdir-modules",
    "--subdir-software",
    "--subdir-user-modules",
    "--suffix-modules-path",
    "--bwrap",
    "--bwrap-installpath",
    "--bwrap-options",
    "--remove-ghost-install-dirs",
)
_ENABLE = "--enable-"


def _option_name(arg):
    """The option ``arg`` is to EasyBuild: ``--enable-<flag>`` is ``--<flag>``, and optparse
    expands an unambiguous abbreviation (``--prefi`` is ``--prefix``)."""
    name = arg.split("=", 1)[0]
    if name.startswith(_ENABLE):
        name = "--" + name[len(_ENABLE) :]
    if len(name) > 2 and name.startswith("--") and name not in _REDIRECTING_NAMES:
        matches = [full for full in _REDIRECTING_NAMES if full.startswith(name)]
        if len(matches) == 1:
            return matches[0]
    return name


def _redirects(name):
    return (
        name in _REDIRECTING_FLAGS
        or any(name.startswith(prefix) for prefix in _REDIRECTING_PREFIXES)
        # An ambiguous abbreviation (--bwra): EasyBuild refuses it, and it is not passed on.
        or (len(name) > 2 and any(full.startswith(name) for full in _REDIRECTING_NAMES))
    )


def _takes_value(name):
    # An ambiguous abbreviation takes nothing with it: the next argument may be an easyconfig.
    return name not in _FLAG_LIKE and (
        name in _REDIRECTING_NAMES or any(name.startswith(prefix) for prefix in _REDIRECTING_PREFIXES)
    )


def filter_args(args):
    """Return ``(kept, removed)``: the user's EasyBuild arguments without redirecting options."""
    kept, removed = [], []
    index = 0
    while index < len(args):
        arg = args[index]
        name = _option_name(arg)
        if arg.startswith("--") and _redirects(name):
            if "=" not in arg and _takes_value(name) and index + 1 < len(args):
                removed.extend(args[index : index + 2])
                index += 2
                continue
            removed.append(arg)
        else:
            kept.append(arg)
        index += 1
    return kept, removed


def filter_env(env):
    """``env`` without the ``EASYBUILD_*`` variables that mirror the removed options."""
    clean = {}
    for key, value in env.items():
        if key.startswith("EASYBUILD_"):
            option = "--" + key[len("EASYBUILD_") :].lower().replace("_", "-")
            if _redirects(option):
                continue
        clean[key] = value
    return clean


_NAMING_OPTION = "--module-naming-scheme"
_NAMING_VARIABLE = "EASYBUILD_MODULE_NAMING_SCHEME"


def naming_scheme(args, env):
    """The module naming scheme the run's EasyBuild arguments or ``env`` name, and where:
    ``(scheme, "--module-naming-scheme")``, ``(scheme, "EASYBUILD_MODULE_NAMING_SCHEME")``,
    or ``(None, None)`` (EasyBuild's default, EasyBuildMNS, unless a configuration file says
    otherwise)."""
    found = None
    for index, arg in enumerate(args):
        if arg.startswith(_NAMING_OPTION + "="):
            found = arg.split("=", 1)[1]
        elif arg == _NAMING_OPTION and index + 1 < len(args):
            found = args[index + 1]
    if found is not None:
        return found, _NAMING_OPTION
    if env.get(_NAMING_VARIABLE):
        return env[_NAMING_VARIABLE], _NAMING_VARIABLE
    return None, None


def configuration_files(args, env):
    """The EasyBuild configuration files a run of ``eb`` with ``args`` in ``env`` may read, as
    EasyBuild finds them (``easybuild.tools.options``): those ``--configfiles`` and
    ``EASYBUILD_CONFIGFILES`` name, ``<dir>/easybuild.d/*.cfg`` for each directory of
    ``XDG_CONFIG_DIRS`` (``/etc/xdg``), and ``config.cfg`` in ``XDG_CONFIG_HOME``'s
    ``easybuild`` (``~/.config``). Empty: nothing but the arguments and the environment
    configures the run, and no file can name what they do not show."""
    named = [arg for arg in args if arg == "--configfiles" or arg.startswith("--configfiles=")]
    if env.get("EASYBUILD_CONFIGFILES"):
        named.append(env["EASYBUILD_CONFIGFILES"])
    home = env.get("HOME") or os.path.expanduser("~")
    user = os.path.join(
        env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "easybuild", "config.cfg"
    )
    found = [user] if os.path.exists(user) else []
    for directory in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep):
        found.extend(sorted(glob.glob(os.path.join(directory, "easybuild.d", "*.cfg"))))
    return named + found


# A line of ``eb --show-config``: "module-naming-scheme  (F) = HierarchicalMNS".
_SHOWN_SCHEME = re.compile(r"^module-naming-scheme\s+\(([A-Z])\)\s*=\s*(\S+)\s*$", re.M)
_SOURCES = {"F": "a configuration file", "E": "the environment", "C": "the command line", "D": "the default"}


def configured_scheme(show_config_text):
    """The module naming scheme ``eb --show-config`` reports, and how, as EasyBuild says where it
    came from (``(scheme, "module-naming-scheme=X (from a configuration file)")``), or
    ``(None, None)`` when it reports none (EasyBuild's default). A configuration file
    (``EASYBUILD_CONFIGFILES``, ``~/.config/easybuild/config.cfg``) is the one place the run's
    arguments and environment do not show."""
    found = _SHOWN_SCHEME.search(show_config_text or "")
    if found is None:
        return None, None
    scheme, source = found.group(2), _SOURCES.get(found.group(1), "EasyBuild's configuration")
    return scheme, f"module-naming-scheme={scheme} (from {source})"


def with_own_python(env, eb):
    """``env`` in which the ``eb`` wrapper runs the Python installed beside it, if there is one.

    The wrapper takes ``$EB_PYTHON``, else the first ``python3`` on ``PATH`` that imports
    EasyBuild; an ``eb`` of a virtual environment is found by path, with its ``python3`` next to it.
    """
    own_python = os.path.join(os.path.dirname(eb), "python3")
    if not env.get("EB_PYTHON") and os.path.isfile(own_python) and os.access(own_python, os.X_OK):
        env = dict(env, EB_PYTHON=own_python)
    return env


def with_rebuild(args):
    if any(_option_name(arg) in _FORCING for arg in args):
        return list(args)
    return [*list(args), "--rebuild"]


def in_dependency_order(args, order):
    """``args`` with the easyconfigs of the run's modules in ``order`` (``Name/version``,
    dependencies first), each in one of the places those easyconfigs held.

    Without ``--robot`` EasyBuild builds the easyconfigs in the order given; a dependency
    given after its dependent is then still an empty stage at its live path in a sandbox when
    the dependent is built (plain ``eb`` would load the old live one). An easyconfig is the
    module's when its file name is ``<Name>-<version>.eb``, as EasyBuild names them; every
    other argument stays where it was.
    """
    # Name-version.eb of Name/version, the last two parts of a hierarchical name too.
    rank = {"-".join(module.split("/")[-2:]) + ".eb": index for index, module in enumerate(order)}
    places = [index for index, arg in enumerate(args) if os.path.basename(arg) in rank]
    ordered = sorted((args[index] for index in places), key=lambda arg: rank[os.path.basename(arg)])
    result = list(args)
    for index, arg in zip(places, ordered):
        result[index] = arg
    return result


def command(eb, user_args, placement, order=()):
    """The exact EasyBuild command: the user's safe arguments (the run's easyconfigs in
    dependency ``order``), then ``placement``, which wins.

    ``placement`` (the backend's install paths, lock directory, bubblewrap options) comes last:
    for an option given twice EasyBuild takes the last one.
    """
    kept, _removed = filter_args(user_args)
    return [eb, *with_rebuild(in_dependency_order(kept, order)), *placement]
