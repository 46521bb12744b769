# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""``status``: the runs of a state root, or one run in detail. One unreadable journal stops
the listing with its error: a partial list would hide the broken run."""

from __future__ import annotations

import os

from . import journal as journals


def summary(journal, detail=False):
    data = journal.data
    result = {
        "run_id": journal.run_id,
        "kind": data["kind"],
        "schema": data["schema"],
        "state": journal.state,
        "created": data.get("created"),
        "state_since": data.get("state_since"),
    }
    if data["kind"] == "retire":
        result.update({key: data.get(key) for key in ("module_file", "retired_to", "software_dir", "reason")})
    else:
        result["modules"] = [
            {
                "module": entry["module"],
                "stable_path": entry["stable_path"],
                "retired_path": entry["retired_path"],
                "retired_path_exists": os.path.lexists(entry["retired_path"]),
            }
            for entry in journal.modules
        ]
    if detail:
        result["steps"] = data["steps"]
        result["journal"] = journal.path
    return result


def status(state_root, run_id=None):
    if run_id:
        return {"run": summary(journals.find(state_root, run_id), detail=True)}
    return {"runs": [summary(journal) for journal in journals.run_journals(state_root)]}
