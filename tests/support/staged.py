"""A live EasyBuild-style tree and the real ``eb-staged-rebuild`` command to run against it.

The tool runs as a separate process (``python -m hpcstack_ops.staged_rebuild.cli``, the code
of this checkout through a symlinked package), so crashes, signals and locks are real. The
live tree is built by the test builder ``tests/builders/fake-eb`` the way EasyBuild lays
out an install: ``software/Name/version`` and ``modules/all/Name/version.lua``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import checkout

FAKE_EB = checkout.REPO / "tests" / "builders" / "fake-eb"
TOOL_TIMEOUT = 120


def snapshot(*roots: Path) -> dict:
    """Everything under ``roots``: type, bytes, mode, owner and inode of each entry.

    Two equal snapshots mean nothing on disk changed, not even a directory's identity.
    """
    state = {}
    for root in roots:
        if not os.path.lexists(root):
            state[str(root)] = None
            continue
        for path in [root, *sorted(root.rglob("*"))]:
            info = os.lstat(path)
            entry = [stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid, info.st_ino]
            if stat.S_ISREG(info.st_mode):
                entry.append(hashlib.sha256(path.read_bytes()).hexdigest())
            elif stat.S_ISLNK(info.st_mode):
                entry.append(os.readlink(path))
            state[str(path)] = entry
    return state


class LiveLayout:
    """Where things are in a live tree under ``self.installpath``, as EasyBuild lays it out."""

    @property
    def software(self) -> Path:
        return self.installpath / "software"

    @property
    def modules(self) -> Path:
        return self.installpath / "modules"

    @property
    def modules_all(self) -> Path:
        return self.modules / "all"

    def live(self, module: str) -> Path:
        return self.software / module

    def module_file(self, module: str) -> Path:
        return self.modules_all / (module + ".lua")


@dataclass
class StagedSite(LiveLayout):
    """A live tree under ``installpath``, a state root, and the tool to run on them."""

    installpath: Path
    state_root: Path
    package_root: Path
    env: dict = field(default_factory=dict)

    def payload(self, module: str) -> str:
        return (self.live(module) / "PAYLOAD").read_text().strip()

    def install(self, *modules: str, payload="old", depends="") -> None:
        """Build ``modules`` straight into the live tree (the state before any staged rebuild)."""
        env = dict(os.environ, FAKE_EB_PAYLOAD=payload, FAKE_EB_DEPENDS=depends)
        easyconfigs = [module.replace("/", "-") + ".eb" for module in modules]
        done = subprocess.run(
            [str(FAKE_EB), f"--installpath={self.installpath}", *easyconfigs],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr

    def tool_env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONPATH"] = str(self.package_root)
        env["EB_STAGED_REBUILD_EB"] = str(FAKE_EB)
        env.update({key: str(value) for key, value in extra.items()})
        return env

    def command(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hpcstack_ops.staged_rebuild.cli",
            "--state-root",
            str(self.state_root),
            *args,
        ]

    def run(self, *args: str, env=None, timeout=TOOL_TIMEOUT) -> subprocess.CompletedProcess:
        """Run ``eb-staged-rebuild --state-root <root> ARGS``; never raises on a non-zero exit."""
        return subprocess.run(
            self.command(*args),
            env=self.tool_env(**(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def rebuild_args(self, *modules: str, extra=()) -> list[str]:
        """The test builder knows no sandbox: ``installpath`` unless ``extra`` names a backend."""
        args = ["rebuild", f"--installpath={self.installpath}"]
        if not any(arg.startswith("--backend") for arg in extra):
            args.append("--backend=installpath")
        for module in modules:
            args += ["--module", module]
        return [*args, *extra, "--", *(module.replace("/", "-") + ".eb" for module in modules)]

    def rebuild(self, *modules: str, extra=(), env=None) -> subprocess.CompletedProcess:
        return self.run(*self.rebuild_args(*modules, extra=extra), env=env)

    def snapshot(self) -> dict:
        return snapshot(self.software, self.modules)


def _core(name):
    """A module of the core, imported on first use: this module is loaded with the
    integration conftest, before the test session makes ``ansible_collections`` importable."""
    import importlib  # noqa: PLC0415

    return importlib.import_module(
        f"ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.{name}"
    )


def fake_eb_request(site: StagedSite, module: str, run_id: str):
    """The request the core's rebuild commands take (``request.RebuildRequest``): ``module``
    built by the test builder, which knows no sandbox (hence the installpath backend). The
    host's variables play no part: the options name everything."""
    return _core("request").resolve(
        {
            "installpath_software": str(site.software),
            "installpath_modules": str(site.modules),
            "modules": [module],
            "eb": str(FAKE_EB),
            "backend": "installpath",
            "run_id": run_id,
        },
        {},
        [module.replace("/", "-") + ".eb"],
    )


def publish_in_process(site: StagedSite, module: str, run_id: str) -> dict:
    """Rebuild and publish ``module`` as run ``run_id`` through the core, in this process."""
    request = fake_eb_request(site, module, run_id)
    return _core("commands").run_rebuild(request, str(site.state_root), lambda line: None, dict(os.environ))


@pytest.fixture(scope="session")
def package_root():
    """A directory with ``hpcstack_ops`` -> this checkout's plugins/module_utils."""
    with tempfile.TemporaryDirectory(prefix="hpcstack-pkg-") as tmp:
        yield checkout.link_package(Path(tmp))


@pytest.fixture
def staged_site(tmp_path, package_root) -> StagedSite:
    return StagedSite(installpath=tmp_path / "apps", state_root=tmp_path / "state", package_root=package_root)
