"""EasyBuild asked a question (``ebquery.ask``): a scratch temporary directory of its own,
removed afterwards, and one line for every way the question can go unanswered.

The "EasyBuild" here is a small shell script that reports its arguments and temporary
directories, or fails, or hangs; the processes are real.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import ebquery

# Prints its arguments, then the variables, then whether the scratch directory exists.
REPORTING_EB = """\
#!/bin/sh
printf '%s\\n' "$@"
echo "EASYBUILD_TMPDIR=$EASYBUILD_TMPDIR"
echo "TMPDIR=$TMPDIR"
[ -d "$TMPDIR" ] && echo "scratch exists"
mkdir "$TMPDIR/left-behind"
"""


def _eb(tmp_path, body):
    eb = tmp_path / "eb"
    eb.write_text(body)
    eb.chmod(0o755)
    return str(eb)


def test_the_question_runs_after_the_command_with_a_scratch_temporary_directory_removed_afterwards(tmp_path):
    eb = _eb(tmp_path, REPORTING_EB)
    asked = []

    def question(scratch):
        asked.append(scratch)
        return ["--installpath=" + os.path.join(scratch, "install"), "--dry-run-short"]

    done = ebquery.ask(eb, [eb, "toy-0.0.eb"], {"PATH": os.defpath}, question, "the dry run")

    (scratch,) = asked
    assert done.stdout.decode().splitlines() == [
        "toy-0.0.eb",
        "--tmpdir=" + scratch,
        "--installpath=" + os.path.join(scratch, "install"),
        "--dry-run-short",
        "EASYBUILD_TMPDIR=" + scratch,
        "TMPDIR=" + scratch,
        "scratch exists",
    ]
    # EasyBuild leaves its temporary directories behind; the scratch goes with them.
    assert not os.path.lexists(scratch)


def test_a_failing_easybuild_is_one_line_with_its_exit_status_and_its_words(tmp_path):
    eb = _eb(tmp_path, "#!/bin/sh\necho 'ERROR: no such option: --bogus' >&2\nexit 2\n")

    with pytest.raises(ebquery.Unanswered) as caught:
        ebquery.ask(eb, [eb], {"PATH": os.defpath}, lambda _s: ["--show-config"], "eb --show-config")

    assert str(caught.value) == "eb --show-config failed (exit 2): ERROR: no such option: --bogus"


def test_an_easybuild_that_cannot_be_started_is_named(tmp_path):
    missing = str(tmp_path / "no-eb")

    with pytest.raises(ebquery.Unanswered) as caught:
        ebquery.ask(missing, [missing], {}, lambda _s: [], "eb --show-config")

    assert str(caught.value) == f"cannot run {missing}: No such file or directory"


def test_an_easybuild_that_does_not_answer_in_time_is_stopped_and_named(tmp_path, monkeypatch):
    eb = _eb(tmp_path, textwrap.dedent("#!/bin/sh\nexec sleep 60\n"))
    monkeypatch.setattr(ebquery, "TIMEOUT", 0.5)

    with pytest.raises(ebquery.Unanswered) as caught:
        ebquery.ask(eb, [eb], {"PATH": os.defpath}, lambda _s: [], "the dry run")

    assert str(caught.value) == "the dry run did not finish within 0.5 s"
