"""The demo's rebuild, rollback and gc again, as an administrator runs them: the collection's
playbooks (``ansible-playbook hpcstack.ops.rebuild`` ...) against localhost.

The live tree is the demo's, already built; the playbook first finds TinyApp up to date
(built from the same easyconfig by the same EasyBuild), then rebuilds it from an edited
easyconfig, and the rollback and gc playbooks undo and collect, each run once more to show
that a second run changes nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import stackenv
import tinypkgs
from localplay import LocalPlaybooks

MODULE = f"{tinypkgs.APP}/{tinypkgs.VERSION}"


def say(text: str) -> None:
    print(f"demo (ansible): {text}", flush=True)


def _summary(play) -> list:
    """The lines of the rebuild playbook's report, without Ansible's JSON quoting."""
    return re.findall(r'^\s+"(localhost: .*)",?$', play.stdout, re.M)


def run(env: dict, demo: Path, state_root: Path, easyconfig: Path) -> int:
    """Rebuild, roll back and collect the demo's TinyApp through the playbooks; 0 when all went right."""
    live = demo / "software" / tinypkgs.APP / tinypkgs.VERSION
    with tempfile.TemporaryDirectory(prefix="hpcstack-demo-ansible-") as tmp:
        edited = Path(tmp) / easyconfig.name
        shutil.copy(easyconfig, edited)
        playbooks = LocalPlaybooks(Path(tmp), env)
        common = ("-e", "staged_hosts=localhost", "-e", f"staged_state_root={state_root}")

        def rebuild(with_easyconfig: Path):
            wanted = {"staged_modules": [MODULE], "staged_easyconfigs": [str(with_easyconfig)]}
            extra = (
                "-e",
                f"staged_installpath={demo}",
                "-e",
                json.dumps(wanted),
                "-e",
                f"staged_eb={stackenv.find_eb()}",
            )
            return playbooks.run("rebuild", *common, *extra)

        def report(command: str, play) -> bool:
            say(f"{command}: changed={play.changed}, failed={play.failed}")
            if play.failed != 0 or play.done.returncode != 0:
                print(play.output[-3000:])
                return False
            return True

        say("ansible-playbook hpcstack.ops.rebuild with the easyconfig TinyApp was built from")
        same = rebuild(easyconfig)
        if not report("rebuild", same):
            return 1
        for line in _summary(same):
            say(line)
        edited.write_text(edited.read_text() + "# rebuilt with the site's new compiler flags\n")
        before = live.stat().st_ino
        say("ansible-playbook hpcstack.ops.rebuild with an edited easyconfig")
        published = rebuild(edited)
        if not report("rebuild", published):
            return 1
        for line in _summary(published):
            say(line)
        say(f"{live}: inode {before} -> {live.stat().st_ino}")
        run_id = published.published_run_id()
        for attempt in ("", " (again)"):
            play = playbooks.run("rollback", *common, "-e", f"staged_run_id={run_id}")
            if not report(f"ansible-playbook hpcstack.ops.rollback -e staged_run_id={run_id}{attempt}", play):
                return 1
        say(f"{live}: inode {live.stat().st_ino}, the previous directory again")
        for attempt in ("", " (again)"):
            play = playbooks.run("gc", *common, "-e", "staged_grace_hours=0")
            if not report(f"ansible-playbook hpcstack.ops.gc -e staged_grace_hours=0{attempt}", play):
                return 1
        left = sorted(path.name for path in live.parent.iterdir())
        say(f"{live.parent} holds {', '.join(left)}: the rebuilt tree was collected")
    return 0
