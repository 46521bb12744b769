"""A hand-edited retire journal cannot make rollback move another file into place.

A retire keeps its module file at one place only, ``<state-root>/retired/<stamp>/<path>``;
rollback takes the file from there and nowhere else. A journal whose ``retired_to`` or
``module_file`` was edited to point elsewhere is refused whole, in one line, and neither the
file it names nor the place it names is touched.
"""

from __future__ import annotations

import json

import pytest

APP = "TinyApp/1.0"


def _retire(site):
    site.install(APP)
    done = site.run("--json", "retire", str(site.module_file(APP)), "--reason", "on /cvmfs")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    journal = site.state_root / "runs" / result["run_id"] / "journal.json"
    return result, journal


def _edit(journal, **fields):
    data = json.loads(journal.read_text())
    data.update(fields)
    journal.write_text(json.dumps(data))


@pytest.mark.parametrize("edited", ["retired_to", "module_file", "both"])
def test_rollback_of_a_retire_whose_journal_points_elsewhere_is_refused(staged_site, tmp_path, edited):
    site = staged_site
    result, journal = _retire(site)
    victim = tmp_path / "victim" / "secret.txt"
    victim.parent.mkdir()
    victim.write_text("not a module file\n")
    target = tmp_path / "elsewhere" / "planted.lua"
    fields = {
        "retired_to": {"retired_to": str(victim)},
        "module_file": {"module_file": str(target)},
        "both": {"retired_to": str(victim), "module_file": str(target)},
    }[edited]
    _edit(journal, **fields)
    before = site.snapshot()

    done = site.run("rollback", result["run_id"])

    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"eb-staged-rebuild: journal {journal}: retired_to ")
    assert "Traceback" not in done.stderr
    assert victim.read_text() == "not a module file\n"
    assert not target.exists()
    assert site.snapshot() == before
