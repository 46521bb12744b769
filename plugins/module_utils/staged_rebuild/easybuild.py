# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EasyBuild command of a staged build: the user's arguments, made safe.

Options that could send the build somewhere else than the stage are removed, in both the
``--opt=value`` and ``--opt value`` forms, together with their ``EASYBUILD_*`` environment
equivalents; ``--rebuild`` is added unless the user asked for ``--rebuild`` or ``--force``.
"""

from __future__ import annotations

# Options whose value is a path or a redirection (they take a value).
_REDIRECTING_PREFIXES = ("--installpath", "--subdir-", "--bwrap")
_REDIRECTING_EXACT = ("--prefix",)
# Flags without a value that would touch the live install.
_REDIRECTING_FLAGS = ("--remove-ghost-install-dirs",)
_FORCING = ("--rebuild", "--force", "-f")
# Options among the removed ones that are flags (take no value).
_FLAG_LIKE = ("--bwrap", "--remove-ghost-install-dirs")


def _option_name(arg):
    return arg.split("=", 1)[0]


def _redirects(name):
    return (
        name in _REDIRECTING_EXACT
        or name in _REDIRECTING_FLAGS
        or any(name.startswith(prefix) for prefix in _REDIRECTING_PREFIXES)
    )


def _takes_value(name):
    return name not in _FLAG_LIKE


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


def with_rebuild(args):
    if any(_option_name(arg) in _FORCING for arg in args):
        return list(args)
    return [*list(args), "--rebuild"]


def staged_command(eb, user_args, software, modules):
    """The exact command that builds into the stage trees ``software`` and ``modules``."""
    kept, _removed = filter_args(user_args)
    return [eb, *with_rebuild(kept), "--installpath-software=" + software, "--installpath-modules=" + modules]
