"""The Python interpreters of given versions on this machine: PATH, /usr/bin, pyenv.

    python tools/pythons.py [--venv] VERSION...     # prints "VERSION PATH" per version found

A pyenv shim answers to every ``pythonX.Y`` name but fails for versions not selected, so
each candidate is run, and the interpreter's own path (``sys.executable``) is reported
rather than the shim's. ``--venv`` keeps only interpreters that can create virtual
environments (Debian splits ``ensurepip`` into python3-venv).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

_PROBE = "import sys{imports}; print('%d.%d' % sys.version_info[:2], sys.executable)"


def _candidates(version: str):
    name = f"python{version}"
    found = shutil.which(name)
    if found:
        yield found
    yield f"/usr/bin/{name}"
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    # Newest patch release first.
    yield from sorted(
        glob.glob(f"{pyenv_root}/versions/{version}.*/bin/{name}"),
        key=lambda path: [int(part) for part in path.split("/versions/")[1].split("/")[0].split(".")],
        reverse=True,
    )


def find(version: str, *, venv: bool = False) -> str | None:
    """The path of a working ``python{version}``, or None."""
    probe = _PROBE.format(imports=", ensurepip, venv" if venv else "")
    for candidate in _candidates(version):
        if not os.access(candidate, os.X_OK):
            continue
        done = subprocess.run([candidate, "-c", probe], capture_output=True, text=True, check=False)
        answer = done.stdout.split(maxsplit=1)
        if done.returncode == 0 and len(answer) == 2 and answer[0] == version:
            return answer[1].strip()
    return None


def main(argv: list[str]) -> int:
    venv = "--venv" in argv
    for version in (arg for arg in argv if arg != "--venv"):
        path = find(version, venv=venv)
        if path:
            sys.stdout.write(f"{version} {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
