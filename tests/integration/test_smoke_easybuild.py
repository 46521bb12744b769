"""Real EasyBuild builds the tiny dependency chain, and real Lmod loads the result."""

from __future__ import annotations

import subprocess

import tinypkgs


def _module_shell(easybuild, installpath, script):
    env = easybuild.lmod.env([installpath / "modules" / "all"])
    return subprocess.run(
        easybuild.lmod.shell_command(script), env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_easybuild_builds_the_dependency_chain_and_module_load_runs_its_program(easybuild, tmp_path):
    live = tmp_path / "live"
    done = easybuild.build(live, str(easybuild.packages.easyconfig(tinypkgs.APP)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Build succeeded for 2 out of 2" in done.stdout

    for name in (tinypkgs.LIB, tinypkgs.APP):
        install = live / "software" / name / tinypkgs.VERSION
        assert (install / "easybuild" / f"{name}-{tinypkgs.VERSION}.eb").is_file()
        modulefile = live / "modules" / "all" / name / f"{tinypkgs.VERSION}.lua"
        assert f'local root = "{install}"' in modulefile.read_text()
    app_module = (live / "modules" / "all" / tinypkgs.APP / f"{tinypkgs.VERSION}.lua").read_text()
    assert f'depends_on("{tinypkgs.LIB}/{tinypkgs.VERSION}")' in app_module

    loaded = _module_shell(easybuild, live, f"module load {tinypkgs.APP}/{tinypkgs.VERSION} && tinyapp")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == tinypkgs.GREETING


def test_lmod_loads_the_dependency_with_the_module(easybuild, tmp_path):
    live = tmp_path / "live"
    assert easybuild.build(live, str(easybuild.packages.easyconfig(tinypkgs.APP))).returncode == 0

    listed = _module_shell(easybuild, live, f"module load {tinypkgs.APP} && echo $LOADEDMODULES")
    assert listed.stdout.strip().split(":") == [
        f"{tinypkgs.LIB}/{tinypkgs.VERSION}",
        f"{tinypkgs.APP}/{tinypkgs.VERSION}",
    ]


def test_lmod_refuses_a_module_that_is_not_installed(easybuild, tmp_path):
    (tmp_path / "modules" / "all").mkdir(parents=True)
    missing = _module_shell(easybuild, tmp_path, f"module load {tinypkgs.APP} && echo loaded")
    assert "loaded" not in missing.stdout
    assert "unknown" in missing.stderr.lower() or "not found" in missing.stderr.lower(), missing.stderr


def test_easybuild_refuses_a_source_whose_checksum_does_not_match(easybuild, tmp_path):
    easyconfig = tmp_path / f"{tinypkgs.LIB}-{tinypkgs.VERSION}.eb"
    original = easybuild.packages.easyconfig(tinypkgs.LIB).read_text()
    checksum = original.split("checksums = ['")[1].split("'")[0]
    easyconfig.write_text(original.replace(checksum, "0" * 64))
    live = tmp_path / "live"

    done = easybuild.build(live, str(easyconfig))

    assert done.returncode != 0
    assert "checksum" in (done.stdout + done.stderr).lower()
    # EasyBuild leaves the empty directories it created, but no module file and no install.
    assert not (live / "modules" / "all" / tinypkgs.LIB / f"{tinypkgs.VERSION}.lua").exists()
    assert not any((live / "software" / tinypkgs.LIB / tinypkgs.VERSION).iterdir())
