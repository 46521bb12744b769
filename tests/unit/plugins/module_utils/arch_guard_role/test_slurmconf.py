"""What the role reads in slurm.conf and keeps beside it, from text."""

from __future__ import annotations

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.arch_guard_role import slurmconf

CONF = """\
ClusterName=test
  taskprolog = "/etc/slurm/prolog.sh"   # the site's own
TaskPrologX=/not/this
#TaskProlog=/commented
TaskProlog=/last"""


def test_task_prolog_lines_are_found_whatever_their_case_and_blanks():
    assert slurmconf.task_prolog_lines(CONF) == [
        {"text": '  taskprolog = "/etc/slurm/prolog.sh"   # the site\'s own', "terminated": True},
        {"text": "TaskProlog=/last", "terminated": False},
    ]


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ("TaskProlog=/a/b", "/a/b"),
        ('TaskProlog = "/a b/c"', "/a"),
        ("taskprolog=/a/b # comment", "/a/b"),
        ('TaskProlog="/a/b"#x', "/a/b"),
        ("TaskProlog=", ""),
        ("ClusterName=x", ""),
    ],
)
def test_the_path_a_line_names(line, path):
    assert slurmconf.line_path(line) == path


@pytest.mark.parametrize(
    ("text", "user"),
    [
        ("SlurmdUser=slurm\n", "slurm"),
        ("slurmduser = 64030 # ours\nSlurmdUser=root\n", "root"),
        ("X=1\n", None),
    ],
)
def test_slurmd_user_is_the_last_one(text, user):
    assert slurmconf.slurmd_user(text) == user


def test_node_names_are_listed_once_in_order():
    listing = "NodeName=c2 Arch=x86_64\nNodeName=c1 Arch=x86_64\nNodeName=c2 State=IDLE\n"

    assert slurmconf.node_names(listing) == ["c2", "c1"]


@pytest.mark.parametrize("line", ["TaskProlog = /a # x", None])
def test_a_kept_line_reads_back_as_it_was_written(line):
    text = slurmconf.kept_text("/etc/slurm/slurm.conf", line)

    assert text.endswith("}\n")
    assert slurmconf.parse_kept(text) == {"slurm_conf": "/etc/slurm/slurm.conf", "line": line}


@pytest.mark.parametrize("text", ["[]", '{"line": 3}', "{", '"x"'])
def test_a_kept_file_the_role_did_not_write_is_refused(text):
    with pytest.raises(ValueError):
        slurmconf.parse_kept(text)
