"""The install tree of the publish-window benchmark, and a stand-in ``eb`` that builds it.

An install here is what the test builder ``tests/builders/fake_eb.py`` writes (PAYLOAD,
``easybuild/Name-version.eb``, the module file and its class link) plus ``PARTS`` files of
``PART_SIZE`` bytes, so that a reader can tell a whole tree from a partial one. Every file a
reader checks starts with the generation's tag, one line: PAYLOAD is that line alone (as
fake-eb writes it) and each part is the line padded to ``PART_SIZE`` bytes.

Run as a program it is the ``eb`` of the benchmark's staged rebuilds: fake-eb's build, then
the parts of each install, tagged with ``FAKE_EB_PAYLOAD`` as PAYLOAD is.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "builders")
)

import fake_eb

PARTS = 30
PART_SIZE = 4096
PAYLOAD = "PAYLOAD"
# What a reader opens: every file whose tag must agree, PAYLOAD first as a loader would.
MANIFEST = (PAYLOAD, *(f"part-{index:02d}" for index in range(PARTS)))


def part_bytes(tag: str) -> bytes:
    line = (tag + "\n").encode()
    return line + b"." * (PART_SIZE - len(line))


def write_parts(install: str, tag: str) -> None:
    data = part_bytes(tag)
    for name in MANIFEST[1:]:
        with open(os.path.join(install, name), "wb") as handle:
            handle.write(data)


def write_install(install: str, tag: str, name: str, version: str) -> None:
    """The software tree alone, written in place as a builder does: no module file."""
    os.makedirs(os.path.join(install, "easybuild"), exist_ok=True)
    with open(os.path.join(install, PAYLOAD), "w") as payload:
        payload.write(tag + "\n")
    write_parts(install, tag)
    with open(os.path.join(install, "easybuild", f"{name}-{version}.eb"), "w") as easyconfig:
        easyconfig.write(f"name = {name!r}\nversion = {version!r}\n")


def main(argv: list[str]) -> int:
    status = fake_eb.main(argv)
    if status != 0:
        return status
    options, easyconfigs = fake_eb.parse(argv)
    software = options.get("--installpath-software") or os.path.join(options["--installpath"], "software")
    tag = os.environ.get("FAKE_EB_PAYLOAD", "new build")
    for easyconfig in easyconfigs:
        name, version = os.path.basename(easyconfig)[: -len(".eb")].split("-", 1)
        write_parts(os.path.join(software, name, version), tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
