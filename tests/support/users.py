"""An unprivileged user for tests that must not run as root (bwrap, user namespaces).

As root, the fixture creates the system user ``hpcstack-test`` once and runs commands as it
through ``setpriv``. The user is left in place: other test workers may be using it, and a
second run reuses it. Run by an ordinary user, the tests use that user as it is.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

TEST_USER = "hpcstack-test"
# A second unprivileged user, of its own uid: the attacker of the hardening tests, who is
# neither root nor the build account.
ATTACKER_USER = "hpcstack-attacker"
# useradd exit codes: 9 = the name exists already; 10 = the passwd file is locked (another
# worker is adding the same user right now).
_USERADD_EXISTS = 9
_USERADD_LOCKED = 10


@dataclass(frozen=True)
class UnprivilegedUser:
    name: str
    uid: int
    gid: int

    def command(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return list(argv)
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", *argv]

    def env(self) -> dict:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": "/",
            "USER": self.name,
            "LOGNAME": self.name,
            "LANG": "C.UTF-8",
        }

    def run(self, argv: list[str], *, cwd="/", env=None, timeout=60) -> subprocess.CompletedProcess:
        """Run ``argv`` as this user and capture its output; never raises on a non-zero exit."""
        return subprocess.run(
            self.command(argv),
            cwd=cwd,
            env=self.env() if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _ensure_user(name: str) -> pwd.struct_passwd:
    for _attempt in range(20):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        done = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode not in (0, _USERADD_EXISTS, _USERADD_LOCKED):
            pytest.fail(f"useradd {name} failed: {done.stderr.strip()}")
        if done.returncode == _USERADD_LOCKED:
            time.sleep(0.5)
    return pwd.getpwnam(name)


@pytest.fixture(scope="session")
def unprivileged_user() -> UnprivilegedUser:
    """The unprivileged user; never root."""
    entry = _ensure_user(TEST_USER) if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    return UnprivilegedUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


@pytest.fixture(scope="session")
def attacker_user(unprivileged_user) -> UnprivilegedUser:
    """Another unprivileged user, never root and never the build account: what a hostile user
    on the same node can do is what this one does. Needs root to exist (setpriv)."""
    if os.geteuid() != 0:
        pytest.fail("the attacker tests need root: a second uid is made and taken with setpriv")
    entry = _ensure_user(ATTACKER_USER)
    if entry.pw_uid == unprivileged_user.uid:
        pytest.fail(f"{ATTACKER_USER} has the build account's uid {entry.pw_uid}")
    return UnprivilegedUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)


@pytest.fixture
def user_tmp_path(unprivileged_user):
    """A fresh directory the test user owns (pytest's own tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="hpcstack-user-"))
    os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)
