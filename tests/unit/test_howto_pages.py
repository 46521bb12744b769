"""The how-tos' commands are what their tests run: every ``sh`` block of a page, in order,
and nothing else; every page in docs/howto/ has its test, which runs that page."""

from __future__ import annotations

import re

import pytest

import checkout
from tests.support import howto

TESTS = checkout.REPO / "tests" / "integration" / "tooling"
PAGES = sorted(path.name for path in howto.HOWTO.glob("*.md"))


def test_only_sh_blocks_are_commands_and_each_runs_in_page_order():
    page = (
        "Intro\n\n```sh\n. demo/demo.env\n```\n\n"
        "```console\n$ not run\n```\n\n"
        "````sh\ncat > f <<'EOF'\n```sh\nnested\n```\nEOF\n````\n\n"
        "```yaml\nkey: value\n```\n"
        "```sh \necho last\n```\n"
    )

    assert howto.shell_blocks(page) == [
        ". demo/demo.env\n",
        "cat > f <<'EOF'\n```sh\nnested\n```\nEOF\n",
        "echo last\n",
    ]
    assert howto.script(page).startswith("set -euo pipefail\n. demo/demo.env\n")


def test_a_block_of_another_language_or_an_unclosed_fence_is_not_run():
    assert howto.shell_blocks("```shell\nrm -rf /\n```\n```bash\nfalse\n```\n") == []
    assert howto.shell_blocks("```sh\nnever closed\n") == []
    with pytest.raises(ValueError, match="no sh block"):
        howto.script("```console\n$ make demo\n```\n")


@pytest.mark.parametrize("page", PAGES)
def test_each_how_to_starts_from_the_demo_s_environment(page):
    blocks = howto.shell_blocks((howto.HOWTO / page).read_text())

    assert blocks[0].splitlines()[0] == ". demo/demo.env"


def test_each_how_to_has_the_one_test_that_runs_it():
    run_by = {}
    for test in TESTS.glob("test_howto_*.py"):
        for name in re.findall(r'run_page\(\s*"([^"]+)"', test.read_text()):
            run_by.setdefault(name, []).append(test.name)

    assert PAGES
    assert {page: len(run_by.get(page, [])) for page in PAGES} == dict.fromkeys(PAGES, 1)
    assert set(run_by) == set(PAGES)
