"""This checkout: which files belong to it, and the names it imports under.

``tracked_files`` is what git knows (committed or new and not ignored), so a copy made from
it is what a clean clone would hold. ``link_collection`` and ``link_package`` make the code
importable under its published names through symlinks in a directory the caller owns,
without writing into the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "hpcstack_ops"


def tracked_files(repo: Path = REPO) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=repo, capture_output=True, text=True, check=True
    )
    return [name for name in listed.stdout.splitlines() if (repo / name).is_file()]


def copy_to(dest: Path, repo: Path = REPO) -> Path:
    """Copy the tracked files into ``dest`` (created); returns ``dest``."""
    for name in tracked_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target, follow_symlinks=False)
    return dest


def link_collection(dest: Path, repo: Path = REPO) -> Path:
    """``dest/ansible_collections/hpcstack/ops`` -> ``repo``; returns ``dest`` for sys.path."""
    namespace = dest / "ansible_collections" / "hpcstack"
    namespace.mkdir(parents=True, exist_ok=True)
    (namespace / "ops").symlink_to(repo, target_is_directory=True)
    return dest


def link_package(dest: Path, repo: Path = REPO) -> Path:
    """``dest/hpcstack_ops`` -> ``repo/plugins/module_utils``; returns ``dest`` for sys.path."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / PACKAGE).symlink_to(repo / "plugins" / "module_utils", target_is_directory=True)
    return dest


def pip_install(target: Path, scratch: Path, repo: Path = REPO) -> subprocess.CompletedProcess:
    """``pip install --target target`` of a copy of the checkout made under ``scratch``.

    Installs what ``pip install .`` would (the package and its console scripts in
    ``target/bin``), from the tracked files only, with the running interpreter.
    """
    source = copy_to(scratch / "src", repo)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def copy_package(dest: Path, repo: Path = REPO) -> Path:
    """Copy ``plugins/module_utils`` alone to ``dest/hpcstack_ops``, as a node without an
    installation holds it; returns ``dest`` (the directory to put on ``sys.path``)."""
    shutil.copytree(
        repo / "plugins" / "module_utils", dest / PACKAGE, ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest


# The guard run from a package directory given as its first argument, the way a node without
# an installation runs it: ``python -IS -c GUARD_LAUNCHER <dir> [guard arguments]``.
GUARD_LAUNCHER = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    f"from {PACKAGE}.arch_guard.cli import main; raise SystemExit(main())"
)


def guard_argv(python: str, package_root: Path, *args: str) -> list[str]:
    """The command that runs ``eessi-arch-guard ARGS`` with ``python -IS`` from ``package_root``."""
    return [python, "-IS", "-c", GUARD_LAUNCHER, str(package_root), *args]


def launcher(python: str, package_root: Path, cli: str) -> str:
    """A script that runs the command ``PACKAGE.CLI:main`` (``cli``: ``arch_guard.cli`` or
    ``staged_rebuild.cli``) with ``python -IS`` from ``package_root``, as a node without an
    installation runs it."""
    return (
        f"#!{python} -IS\n"
        "import sys\n"
        f"sys.path.insert(0, {str(package_root)!r})\n"
        f"from {PACKAGE}.{cli} import main\n"
        "raise SystemExit(main())\n"
    )


def guard_task_prolog(python: str, package_root: Path) -> str:
    """A TaskProlog file that runs the guard with ``python -IS`` from ``package_root``."""
    return launcher(python, package_root, "arch_guard.cli")
