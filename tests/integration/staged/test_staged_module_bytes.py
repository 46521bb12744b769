"""Module files are bytes: a Latin-1 description or bytes that are no UTF-8 at all survive
rebuild, rollback and retire exactly, and none of them ends in a traceback.

EasyBuild writes an easyconfig's description into the module file as it is; a site's old
easyconfigs are often Latin-1. The tool rewrites only the root assignment of a new module
file, and restores or moves the old one whole.
"""

from __future__ import annotations

import json

import pytest

APP = "TinyApp/1.0"
LATIN1 = "e9"  # "é" in Latin-1: not UTF-8 on its own
NOT_UTF8 = "e9ff80"  # no encoding's text either


def _json(done):
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


def _with_bytes(site, hex_bytes):
    site.install(APP)
    path = site.module_file(APP)
    old = path.read_bytes().replace(b"Fake build", b"Fake build " + bytes.fromhex(hex_bytes), 1)
    path.write_bytes(old)
    return old


@pytest.mark.parametrize("hex_bytes", [LATIN1, NOT_UTF8], ids=["latin-1", "not-utf-8"])
def test_a_rebuild_keeps_every_byte_of_the_new_module_file_but_its_root(staged_site, hex_bytes):
    site = staged_site
    _with_bytes(site, hex_bytes)
    staged_root = f'local root = "{site.software}/.eb-staged-rebuild/'.encode()

    result = _json(site.run("--json", *site.rebuild_args(APP), env={"FAKE_EB_HELP_HEX": hex_bytes}))

    assert result["state"] == "published"
    live = site.module_file(APP).read_bytes()
    assert b"Fake build " + bytes.fromhex(hex_bytes) in live
    assert f'local root = "{site.live(APP)}"'.encode() in live
    assert staged_root not in live


@pytest.mark.parametrize("hex_bytes", [LATIN1, NOT_UTF8], ids=["latin-1", "not-utf-8"])
def test_a_rollback_puts_the_old_module_file_back_byte_for_byte(staged_site, hex_bytes):
    site = staged_site
    old = _with_bytes(site, hex_bytes)
    run_id = _json(site.run("--json", *site.rebuild_args(APP), env={"FAKE_EB_HELP_HEX": hex_bytes}))["run_id"]

    result = _json(site.run("--json", "rollback", run_id))

    assert result["state"] == "rolled_back"
    assert site.module_file(APP).read_bytes() == old


@pytest.mark.parametrize("hex_bytes", [LATIN1, NOT_UTF8], ids=["latin-1", "not-utf-8"])
def test_a_retire_and_its_rollback_move_the_module_file_byte_for_byte(staged_site, hex_bytes):
    site = staged_site
    old = _with_bytes(site, hex_bytes)

    retired = _json(site.run("--json", "retire", str(site.module_file(APP)), "--reason", "on /cvmfs"))

    assert not site.module_file(APP).exists()
    with open(retired["retired_to"], "rb") as handle:
        assert handle.read() == old
    status = _json(site.run("--json", "status"))
    assert [run["state"] for run in status["runs"]] == ["retired"]
    _json(site.run("--json", "rollback", retired["run_id"]))
    assert site.module_file(APP).read_bytes() == old
