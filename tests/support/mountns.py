"""A command run in a mount namespace of its own, for tests that mount something (a tmpfs
to fill, a read-only bind) only for the process under test: the mounts go with it, and
nothing else on the machine sees them.
"""

from __future__ import annotations


def in_private_mounts(script: str, *args: str) -> list[str]:
    """``sh -c SCRIPT sh ARGS...`` in a new mount namespace whose mounts do not propagate
    back (``unshare --mount --propagation private``); ``$1``... are ``args``. Needs root."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *args]
