# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the arch_guard role reads in slurm.conf and keeps beside it: the TaskProlog lines, the
path a line names, SlurmdUser, the nodes ``scontrol show nodes`` lists, and the line found
before the guard's, kept in the state directory so that removal can put it back byte for byte.

Pure functions of text; the survey (``survey.py``) reads the files.
"""

from __future__ import annotations

import json
import re

# slurm.conf's TaskProlog lines: the key is case-insensitive there, blanks may surround "=".
# The same expression is lineinfile's regexp in the role (tasks/configure.yml, remove.yml).
TASK_PROLOG = r"^[ \t]*(?i:TaskProlog)[ \t]*="
_TASK_PROLOG_LINE = re.compile(TASK_PROLOG + r".*$", re.M)
# Its value: the path, up to a blank or a comment (quotes around it dropped).
_VALUE = re.compile(r"^[ \t]*(?i:TaskProlog)[ \t]*=[ \t]*\"?([^\"\s#]*)")
_SLURMD_USER = re.compile(r"^[ \t]*(?i:SlurmdUser)[ \t]*=[ \t]*\"?([^\"\s#]+)", re.M)
_NODE_NAME = re.compile(r"^NodeName=(\S+)", re.M)
# Where the line found before the guard's is kept, in arch_guard_state_dir.
KEPT_FILE = "previous-task-prolog.json"
KEPT_MAX_BYTES = 64 * 1024


def task_prolog_lines(text: str) -> list:
    """Each TaskProlog line of ``text`` as ``{"text": the line without its newline,
    "terminated": whether a newline ends it}``, in order."""
    return [
        {"text": found.group(0), "terminated": text[found.end() : found.end() + 1] == "\n"}
        for found in _TASK_PROLOG_LINE.finditer(text)
    ]


def line_path(line: str) -> str:
    """The path a TaskProlog line names ("" for none)."""
    found = _VALUE.match(line)
    return found.group(1) if found else ""


def slurmd_user(text: str):
    """The last SlurmdUser of ``text`` (Slurm takes the last), or None: slurmd runs as root."""
    found = _SLURMD_USER.findall(text)
    return found[-1] if found else None


def node_names(listing: str) -> list:
    """The NodeNames of ``scontrol show nodes --oneliner``, each once, in order."""
    return list(dict.fromkeys(_NODE_NAME.findall(listing)))


def kept_text(slurm_conf: str, line) -> str:
    """The kept file's content for ``line`` (None: there was no TaskProlog line) of ``slurm_conf``."""
    return json.dumps({"slurm_conf": slurm_conf, "line": line}) + "\n"


def parse_kept(text: str) -> dict:
    """``{"slurm_conf", "line"}`` of a kept file; ValueError when it is not one the role wrote."""
    kept = json.loads(text)
    if not isinstance(kept, dict) or not isinstance(kept.get("line"), (str, type(None))):
        raise ValueError("not a kept TaskProlog line")
    return {"slurm_conf": kept.get("slurm_conf"), "line": kept["line"]}
