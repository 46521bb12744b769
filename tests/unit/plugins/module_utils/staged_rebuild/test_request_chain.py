"""A request with ``--with-dependants`` (``request.resolve``): expanded to its chain, checked
before anything is built, kept in the journal with its plan; and the EasyBuild arguments and
the plan's text made of it (``rebuild.eb_args``, ``text.chain_plan``)."""

from __future__ import annotations

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    backends,
    rebuild,
    records,
    settings,
    text,
    uptodate,
)
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import request as request_module
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.request import RebuildRequest
from tests.support.chains import flat_chain


@pytest.fixture
def site(tmp_path):
    flat_chain(tmp_path / "apps")
    eb = tmp_path / "bin" / "eb"
    eb.parent.mkdir()
    eb.write_text("#!/bin/sh\nexit 0\n")
    eb.chmod(0o755)
    return tmp_path


def _resolve(site, environ=None, eb_args=("--robot", "/given/libtoy-0.0.eb", "--debug"), **changes):
    values = {
        "installpath": str(site / "apps"),
        "modules": ["libtoy/0.0"],
        "eb": str(site / "bin" / "eb"),
        "with_dependants": True,
        "backend": "userns",
        "run_id": "run1",
    }
    values.update(changes)
    return request_module.resolve(values, environ or {}, list(eb_args))


def _refusal(site, environ=None, **changes):
    with pytest.raises(errors.UsageError) as raised:
        _resolve(site, environ, **changes)
    message = raised.value.render(settings.flag)
    assert "\n" not in message
    return message


def test_the_request_s_modules_are_the_chain_s_members_in_build_order(site):
    request = _resolve(site)

    assert request.modules_requested == [
        "libtoy/0.0",
        "toyapp/0.0",
        "toptool/2.0",
        "toybuild/3.0",
        "toylib/1.0",
    ]
    assert request.chain is not None
    assert request.chain.members[0].easyconfig == "/given/libtoy-0.0.eb"
    assert request.build_order("run1") == request.modules_requested


def test_the_request_with_its_plan_is_kept_in_the_journal_as_it_is(site):
    request = _resolve(site, exclude=["toylib/1.0"])

    loaded = records.load(RebuildRequest, records.dump(request))

    assert loaded == request
    assert loaded.exclude == ["toylib/1.0"]
    assert loaded.chain.excluded == ["toylib/1.0"]
    assert loaded.build_order("run1") == ["libtoy/0.0", "toyapp/0.0", "toptool/2.0", "toybuild/3.0"]


def test_a_request_without_with_dependants_is_its_modules_alone(site):
    request = _resolve(site, with_dependants=None)

    assert request.modules_requested == ["libtoy/0.0"]
    assert request.chain is None


def test_with_dependants_takes_exactly_one_module(site):
    said = _refusal(site, modules=["libtoy/0.0", "other/1.0"])

    assert said == (
        "--with-dependants takes exactly one --module (the package whose dependants are rebuilt), not 2"
    )


def test_with_dependants_refuses_the_installpath_backend_given_or_configured(site):
    assert _refusal(site, backend="installpath") == (
        "--with-dependants needs the bwrap or userns backend: each dependant is built against the new "
        "builds at their live paths, which only a sandbox shows (--backend installpath builds elsewhere)"
    )
    assert "needs the bwrap or userns backend" in _refusal(
        site, {settings.BACKEND_VARIABLE: "installpath"}, backend=None
    )


def test_exclude_without_with_dependants_is_refused(site):
    assert _refusal(site, with_dependants=None, exclude=["toyapp/0.0"]) == (
        "--exclude goes with --with-dependants"
    )


def test_a_member_that_cannot_be_rebuilt_refuses_the_request(site):
    (site / "apps/software/toylib/1.0/easybuild/toylib-1.0.eb").unlink()

    assert _refusal(site).startswith(
        "dependant toylib/1.0 of libtoy/0.0 cannot be rebuilt: its easyconfig copy "
    )


def test_auto_that_picks_installpath_is_refused_for_a_chain():
    chain_request = type("R", (), {"chain": object(), "backend": "auto"})()
    plain_request = type("R", (), {"chain": None, "backend": "auto"})()

    with pytest.raises(errors.UsageError) as raised:
        rebuild.refuse_unsandboxed_chain(chain_request, "installpath")
    rebuild.refuse_unsandboxed_chain(plain_request, "installpath")
    for backend in backends.SANDBOXED:
        rebuild.refuse_unsandboxed_chain(chain_request, backend)

    assert raised.value.render(settings.flag) == (
        "--with-dependants needs the bwrap or userns backend: each dependant is built against the new "
        "builds at their live paths, which only a sandbox shows, and neither works here (--backend auto "
        "picked installpath; eb-staged-rebuild probe --path DIR tells why)"
    )


def test_the_dependants_easyconfigs_follow_the_named_one_in_easybuild_s_arguments(site):
    request = _resolve(site)
    copies = ["/run/toyapp-0.0.eb", "/run/toptool-2.0.eb", "/run/toybuild-3.0.eb", "/run/toylib-1.0.eb"]

    assert rebuild.eb_args(request, copies) == ["--robot", "/given/libtoy-0.0.eb", *copies, "--debug"]
    # Without the run's copies: the live ones, for the checks that only read them.
    assert rebuild.eb_args(request)[2] == str(site / "apps/software/toyapp/0.0/easybuild/toyapp-0.0.eb")


def test_the_plan_s_text_names_each_member_why_and_from_what(site):
    request = _resolve(site, exclude=["toyapp/0.0"])
    apps = site / "apps" / "software"

    assert text.chain_plan(request.chain.to_result()) == [
        "plan: 3 modules, in build order",
        "  1. libtoy/0.0 (named) from /given/libtoy-0.0.eb",
        "  2. toybuild/3.0 (depends on libtoy/0.0, to build) from "
        f"{apps}/toybuild/3.0/easybuild/toybuild-3.0.eb",
        f"  3. toylib/1.0 (depends on libtoy/0.0) from {apps}/toylib/1.0/easybuild/toylib-1.0.eb",
        "  left out: toyapp/0.0 (keeps linking the old libtoy/0.0)",
        "  left out: toptool/2.0 (keeps linking the old libtoy/0.0)",
    ]


def test_a_chain_s_dependants_are_compared_with_their_own_copies_not_the_named_easyconfig(site):
    given = site / "libtoy-0.0.eb"
    given.write_text("name = 'libtoy'\nversion = '0.0'\ntoolchain = SYSTEM\n# the fix\n")
    request = _resolve(site, eb_args=(str(given),))

    compared = {entry["module"]: entry["why"] for entry in uptodate.compare(request)}

    copy = site / "apps/software/libtoy/0.0/easybuild/libtoy-0.0.eb"
    assert compared.pop("libtoy/0.0") == f"{copy} differs from the requested easyconfig"
    # The stand-in eb prints no version: each dependant's own copy matched, the version cannot.
    assert set(compared.values()) == {"eb --version did not run, so the EasyBuild version cannot be compared"}
    assert len(compared) == 4
