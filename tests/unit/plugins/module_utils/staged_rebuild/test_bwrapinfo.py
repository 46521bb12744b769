"""The check of ``bwrap_info.json``: a bubblewrap build that wrote anywhere else is refused.

The files are written the way EasyBuild 5.4.1 writes them (``easybuild/tools/bwrap.py``,
``prepare_bwrap``): the keys of ``_bwrap_info``, ``json.dumps(..., default=list, indent=2,
sort_keys=True)``, ``bwrap_cmd`` = ``bwrap --dev-bind / /`` + the ``--bwrap-options`` +
``--bind <bwrap_installpath_software>/<mod> <realpath(installpath_software)>/<mod>`` for each
module to install (``--overlay-src ... --overlay ...`` when the live directory could not be made).
The backend's options are those of ``backends.Build``: the live trees read-only, the
generation writable, the view of each ``Name`` over its live directory with the siblings
read-only; the first pass's software path is ``<generation>/first-pass/software``.
"""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import (
    bwrapinfo,
    module_support,
    settings,
)

REQUESTED = ("Tiny/1.0",)


class Site:
    def __init__(self, tmp_path):
        self.installpath = tmp_path / "apps"
        self.software = str(self.installpath / "software")
        self.modules = str(self.installpath / "modules")
        self.generation = os.path.join(self.software, ".eb-staged-rebuild", "run1")
        os.makedirs(os.path.join(self.generation, "software"))
        os.makedirs(self.modules)

    def info(self, modules=("Tiny/1.0",)):
        """What EasyBuild's ``prepare_bwrap`` records for a build of ``modules``."""
        bwrap_software = os.path.join(self.generation, "software")
        bwrap_modules = os.path.join(self.generation, "modules")
        first_pass = os.path.join(self.generation, "first-pass", "software")
        # The backend's --bwrap-options, as EasyBuild splits them at commas.
        options = ["--ro-bind", self.software, self.software, "--ro-bind", self.modules, self.modules]
        options += ["--bind", self.generation, self.generation]
        for name in sorted({module.split("/", maxsplit=1)[0] for module in modules}):
            options += ["--bind", os.path.join(bwrap_software, name), os.path.join(self.software, name)]
        options += ["--setenv", "EASYBUILD_INSTALLPATH_SOFTWARE", self.software, "--die-with-parent"]
        cmd = ["bwrap", "--dev-bind", "/", "/", *options]
        for module in sorted(modules):
            cmd += ["--bind", os.path.join(bwrap_software, module), os.path.join(first_pass, module)]
        return {
            "bwrap_cmd": cmd,
            "bwrap_eb_options": ["--disable-bwrap", f"--installpath-modules={bwrap_modules}"],
            "bwrap_installpath": self.generation,
            "bwrap_installpath_modules": bwrap_modules,
            "bwrap_installpath_software": bwrap_software,
            "installpath_modules": self.modules,
            "installpath_software": first_pass,
            "modules_to_install": set(modules),
        }

    def write(self, info):
        path = os.path.join(self.generation, bwrapinfo.INFO_FILE)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(info, default=list, indent=2, sort_keys=True))
        return path

    def check(self, requested=REQUESTED):
        return bwrapinfo.check(self.generation, requested)


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path)


def _refusal(site, requested=REQUESTED):
    with pytest.raises(errors.PublishError) as caught:
        site.check(requested)
    # As the command line prints it: a setting the message names is spelt as its flag.
    message = caught.value.render(settings.flag)
    assert "\n" not in message
    return message


# accepted


def test_the_file_of_a_bubblewrap_build_of_the_requested_module_is_accepted(site):
    site.write(site.info())

    info = site.check()

    assert info["modules_to_install"] == ["Tiny/1.0"]
    assert info["bwrap_installpath"] == site.generation


def test_a_build_of_several_requested_modules_is_accepted(site):
    site.write(site.info(modules=("Tiny/1.0", "Tiny/2.0", "Other/3.1")))

    info = site.check(["Other/3.1", "Tiny/1.0", "Tiny/2.0"])

    assert sorted(info["modules_to_install"]) == ["Other/3.1", "Tiny/1.0", "Tiny/2.0"]


def test_a_build_that_installed_fewer_modules_than_requested_is_accepted(site):
    # EasyBuild leaves out what is installed already; the planner refuses a missing stage.
    site.write(site.info(modules=("Tiny/1.0",)))

    info = site.check(["Tiny/1.0", "Tiny/2.0"])

    assert info["modules_to_install"] == ["Tiny/1.0"]


# refused: where EasyBuild says it wrote


STAGE_ROOTS = [
    "bwrap_installpath",
    "bwrap_installpath_software",
    "bwrap_installpath_modules",
    "installpath_software",
]


@pytest.mark.parametrize("key", STAGE_ROOTS)
def test_a_stage_root_outside_the_generation_is_refused(site, tmp_path, key):
    info = site.info()
    info[key] = str(tmp_path / "elsewhere")
    site.write(info)

    message = _refusal(site)

    assert message == (
        f"bwrap_info.json names {key} {tmp_path / 'elsewhere'} outside the generation {site.generation}; "
        "nothing was swapped"
    )


@pytest.mark.parametrize("key", STAGE_ROOTS)
def test_a_stage_root_that_is_the_live_software_tree_is_refused(site, key):
    info = site.info()
    info[key] = site.software
    site.write(info)

    assert f"names {key} {site.software} outside the generation" in _refusal(site)


def test_a_stage_root_that_leaves_the_generation_by_dot_dot_is_refused(site):
    info = site.info()
    info["bwrap_installpath_software"] = os.path.join(site.generation, "..", "..", "Tiny")
    site.write(info)

    assert "names bwrap_installpath_software" in _refusal(site)


def test_a_stage_root_that_only_shares_the_generation_s_name_as_a_prefix_is_refused(site):
    info = site.info()
    info["bwrap_installpath"] = site.generation + "-other"
    os.makedirs(site.generation + "-other")
    site.write(info)

    assert f"names bwrap_installpath {site.generation}-other outside" in _refusal(site)


def test_a_stage_root_that_is_a_symlink_out_of_the_generation_is_refused(site, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    link = os.path.join(site.generation, "linked-software")
    os.symlink(outside, link)
    info = site.info()
    info["bwrap_installpath_software"] = link
    site.write(info)

    assert f"names bwrap_installpath_software {link} outside" in _refusal(site)


def test_a_missing_stage_root_key_is_refused(site):
    info = site.info()
    del info["bwrap_installpath_modules"]
    site.write(info)

    assert "has no absolute bwrap_installpath_modules" in _refusal(site)


def test_a_bind_from_outside_the_generation_onto_a_live_target_is_refused(site, tmp_path):
    info = site.info()
    info["bwrap_cmd"][-3:] = [
        "--bind",
        str(tmp_path / "elsewhere" / "Tiny" / "1.0"),
        site.software + "/Tiny/1.0",
    ]
    site.write(info)

    message = _refusal(site)

    assert message == (
        f"bwrap_info.json names writable bind {tmp_path / 'elsewhere' / 'Tiny' / '1.0'} outside the "
        f"generation {site.generation}; nothing was swapped"
    )


def test_a_bind_of_the_live_tree_onto_itself_is_refused(site):
    info = site.info()
    live = site.software + "/Tiny/1.0"
    info["bwrap_cmd"][-3:] = ["--bind", live, live]
    site.write(info)

    assert f"names writable bind {live} outside" in _refusal(site)


def test_a_bind_of_a_live_directory_onto_another_path_is_refused(site, tmp_path):
    # Writable at /tmp/x, the live install would be open to the build under that name.
    info = site.info()
    live = site.software + "/Tiny/2.0"
    info["bwrap_cmd"] += ["--bind", live, str(tmp_path / "x")]
    site.write(info)

    assert f"names writable bind {live} outside" in _refusal(site)


def test_a_read_only_bind_of_a_live_sibling_is_accepted(site):
    # The view shows the other versions of the Name read-only: that is what --ro-bind is for.
    info = site.info()
    live = site.software + "/Tiny/2.0"
    info["bwrap_cmd"] += ["--ro-bind", live, live]
    site.write(info)

    assert site.check()["bwrap_cmd"][-3:] == ["--ro-bind", live, live]


def test_an_overlay_is_refused(site):
    # What prepare_bwrap does when it cannot create the live install directory.
    info = site.info()
    live = site.software + "/Tiny/1.0"
    workdir = os.path.join(site.generation, "workdir", "Tiny/1.0")
    info["bwrap_cmd"][-3:] = [
        "--overlay-src",
        live,
        "--overlay",
        os.path.join(site.generation, "software", "Tiny/1.0"),
        workdir,
        live,
    ]
    site.write(info)

    message = _refusal(site)

    assert message.startswith("EasyBuild's bwrap mode used an overlay")
    assert message.endswith("nothing was swapped")


# refused: what EasyBuild built


def test_a_module_that_was_not_requested_is_refused(site):
    site.write(site.info(modules=("Tiny/1.0", "Dep/0.5")))

    message = _refusal(site)

    assert (
        message == "EasyBuild also built Dep/0.5, which was not requested with --module; nothing was swapped"
    )
    with pytest.raises(errors.PublishError) as caught:
        site.check(REQUESTED)
    assert caught.value.render(module_support.option_name) == (
        "EasyBuild also built Dep/0.5, which was not requested with modules; nothing was swapped"
    )


def test_every_unrequested_module_is_named(site):
    site.write(site.info(modules=("Tiny/1.0", "Dep/0.5", "Base/2")))

    assert "EasyBuild also built Base/2, Dep/0.5, which" in _refusal(site)


# refused: the file itself


def test_a_missing_file_is_refused_naming_it(site):
    message = _refusal(site)

    path = os.path.join(site.generation, "bwrap_info.json")
    assert message.startswith(f"cannot read {path}: ")
    assert "No such file or directory" in message
    assert message.endswith("; nothing was swapped")


def test_a_truncated_file_is_refused_naming_it(site):
    path = site.write(site.info())
    with open(path, "r+", encoding="utf-8") as handle:
        handle.truncate(40)

    assert _refusal(site).startswith(f"cannot read {path}: ")


def test_a_file_that_is_not_utf_8_is_refused(site):
    path = os.path.join(site.generation, bwrapinfo.INFO_FILE)
    with open(path, "wb") as handle:
        handle.write(b'{"bwrap_installpath": "\xff\xfe"}')

    assert _refusal(site).startswith(f"cannot read {path}: ")


def test_a_directory_in_place_of_the_file_is_refused(site):
    path = os.path.join(site.generation, bwrapinfo.INFO_FILE)
    os.mkdir(path)

    assert _refusal(site).startswith(f"cannot read {path}: ")


@pytest.mark.parametrize("document", ["[]", "null", '"bwrap"', "42"])
def test_a_file_that_holds_no_json_object_is_refused(site, document):
    path = os.path.join(site.generation, bwrapinfo.INFO_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(document)

    assert path in _refusal(site)


def test_a_missing_stage_root_key_is_refused_whatever_the_working_directory(site, monkeypatch):
    # realpath("") is the working directory: a missing key must not pass because of where the tool runs.
    info = site.info()
    del info["bwrap_installpath_modules"]
    site.write(info)
    monkeypatch.chdir(site.generation)

    assert "bwrap_installpath_modules" in _refusal(site)
