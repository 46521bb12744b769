"""A strict UTF-8 locale, ``en_US.UTF-8``, made for the tests that write what is not UTF-8.

Under ``C.UTF-8`` (and the C locale, which Python coerces to it) Python writes stdout with
``surrogateescape``, so a byte that is not UTF-8 goes out raw and nothing fails; under any
other UTF-8 locale the stream is strict, and the same write raises ``UnicodeEncodeError``.
Sites run their tools in ``en_US.UTF-8`` and the like, so the tests do too: the locale is
compiled with ``localedef`` from the ``locales`` package's sources into a directory of its
own, which ``LOCPATH`` names; nothing of the machine's is changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

NAME = "en_US.UTF-8"
LOCALEDEF_TIMEOUT = 120


@dataclass(frozen=True)
class Locale:
    """A compiled locale under ``path`` (its ``LOCPATH``), named ``name``."""

    name: str
    path: Path

    def env(self, base=None) -> dict:
        """``base`` (else this process's environment) with this locale for everything."""
        env = dict(os.environ if base is None else base)
        env.update(LOCPATH=str(self.path), LANG=self.name, LC_ALL=self.name)
        return env


@pytest.fixture(scope="session")
def en_us_utf8():
    """``en_US.UTF-8``, in which Python's stdout is UTF-8 and strict."""
    localedef = shutil.which("localedef") or "/usr/bin/localedef"
    if not Path("/usr/share/i18n/locales/en_US").is_file():
        pytest.fail("the en_US locale's source is missing: install the Debian package 'locales'")
    path = Path(tempfile.mkdtemp(prefix="hpcstack-locale-"))
    path.chmod(0o755)  # the test users' processes read it too
    made = subprocess.run(
        [localedef, "-i", "en_US", "-f", "UTF-8", str(path / NAME)],
        capture_output=True,
        text=True,
        timeout=LOCALEDEF_TIMEOUT,
        check=False,
    )
    locale = Locale(NAME, path)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.stdout.encoding, sys.stdout.errors)"],
        env=locale.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.split() != ["utf-8", "strict"]:
        shutil.rmtree(path)
        pytest.fail(f"localedef made no strict {NAME} ({made.stderr.strip()}): Python says {probe.stdout!r}")
    yield locale
    shutil.rmtree(path)
