"""Compile gate: plugins/ must compile, and plugins/module_utils import, on Python 3.8-3.13.

The core runs on compute and build nodes whose Python may be as old as 3.8, while the
tests run on the controller's Python. Every interpreter of those versions found on this
machine (``tools/pythons.py``) compiles every file under plugins/ and imports every module
of plugins/module_utils as the package ``hpcstack_ops``, the way the standalone commands and
the copied guard import it. Exit 1 on any failure; the last line names the versions checked.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import checkout
import pythons

VERSIONS = [f"3.{minor}" for minor in range(8, 14)]

# Runs inside each interpreter: compile every file, then import every core module.
_CHECK = r"""
import importlib, pathlib, sys
plugins, package_root = pathlib.Path(sys.argv[1]), sys.argv[2]
sys.path.insert(0, package_root)
failures = []
for path in sorted(plugins.rglob("*.py")):
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as err:
        failures.append("%s:%s: %s" % (path, err.lineno, err.msg))
core = plugins / "module_utils"
for path in sorted(core.rglob("*.py")):
    parts = path.relative_to(core).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    name = ".".join(("hpcstack_ops",) + parts)
    try:
        importlib.import_module(name)
    except SyntaxError:
        pass  # already reported by compile
    except Exception as err:
        failures.append("import %s: %s: %s" % (name, type(err).__name__, err))
print("\n".join(failures))
sys.exit(1 if failures else 0)
"""


def main(argv: list[str]) -> int:
    """``compile_check.py [REPO]``: check REPO's plugins/ (default: this checkout)."""
    repo = Path(argv[0]) if argv else checkout.REPO
    plugins = repo / "plugins"
    checked, missing, failed = [], [], []
    with tempfile.TemporaryDirectory(prefix="hpcstack-compile-") as tmp:
        package_root = checkout.link_package(Path(tmp), repo)
        for version in VERSIONS:
            interpreter = pythons.find(version)
            if interpreter is None:
                missing.append(version)
                continue
            # -I: no user site, no PYTHON* variables, no current directory on sys.path,
            # as the guard runs on a node.
            done = subprocess.run(
                [interpreter, "-I", "-c", _CHECK, str(plugins), str(package_root)],
                capture_output=True,
                text=True,
                check=False,
            )
            checked.append(version)
            if done.returncode != 0:
                failed.append(version)
                sys.stdout.write(f"Python {version} ({interpreter}):\n{done.stdout}{done.stderr}")
    summary = f"compiled plugins/ with Python {', '.join(checked) or 'none'}"
    if missing:
        summary += f"; not found here: {', '.join(missing)}"
    if failed:
        summary += f"; FAILED on {', '.join(failed)}"
    sys.stdout.write(summary + "\n")
    return 1 if failed or not checked else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
