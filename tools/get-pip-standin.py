# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in for pip's ``get-pip.py``, installing pip from the interpreter's ``ensurepip`` wheel.

``ansible-test`` bootstraps pip into each virtual environment it creates by running a
``get-pip.py`` that it downloads from ci-files.testing.ansible.com and caches as
``~/.ansible/test/cache/get_pip_<version>.py``. That host is not reachable from every
machine this project runs on, so ``tools/ansible-sanity.sh`` puts this file there instead.

It takes get-pip's command line (pip options and requirements such as ``pip==24.2``, plus
``--no-setuptools``/``--no-wheel``) and runs pip from the wheel that ``ensurepip`` bundles
with every CPython to install the requested packages into the running interpreter. Where no
package index answers, it installs the bundled pip wheel itself, offline, and says so.

Runs under every Python ansible-test may bootstrap (3.6 and later): standard library only.
"""

import glob
import os
import subprocess
import sys

try:
    import ensurepip
except ImportError:  # some distributions move ensurepip into a separate package
    ensurepip = None

# get-pip.py options that ``pip install`` does not know.
_GET_PIP_ONLY = ("--no-setuptools", "--no-wheel", "--no-pip")


def _bundled_pip_wheel():
    """Path of the pip wheel that ships with this interpreter's ``ensurepip``, or None."""
    if ensurepip is None:
        return None
    folders = [os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")]
    # Distributions that unbundle the wheels name their folder here (Python 3.10+).
    distro_folder = getattr(ensurepip, "_WHEEL_PKG_DIR", None)
    if distro_folder:
        folders.insert(0, distro_folder)
    for folder in folders:
        wheels = sorted(glob.glob(os.path.join(folder, "pip-*.whl")))
        if wheels:
            return wheels[-1]
    return None


def _run_pip(wheel, pip_args):
    """Run ``python -m pip`` with pip imported from ``wheel``; return its exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (wheel, env.get("PYTHONPATH")) if p)
    return subprocess.call([sys.executable, "-m", "pip", *pip_args], env=env)


def main(argv):
    """Install the packages named on get-pip's command line; return an exit status."""
    args = [arg for arg in argv if arg not in _GET_PIP_ONLY]
    wheel = _bundled_pip_wheel()
    if wheel is None:
        sys.stderr.write("get-pip stand-in: this Python has no ensurepip pip wheel\n")
        return 1
    requested = [arg for arg in args if not arg.startswith("-")]
    options = [arg for arg in args if arg.startswith("-")]
    if not requested:
        requested = ["pip"]
        args.append("pip")
    if _run_pip(wheel, ["install", "--upgrade", "--force-reinstall", *args]) == 0:
        return 0
    sys.stderr.write(
        f"get-pip stand-in: could not install {' '.join(requested)} from a package index;"
        f" installing the bundled {os.path.basename(wheel)}\n"
    )
    return _run_pip(wheel, ["install", "--no-index", *options, wheel])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
