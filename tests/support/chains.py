"""Live trees of installs that depend on each other, written as EasyBuild leaves them: each
install's own easyconfig copy (``<install>/easybuild/<Name>-<dir>.eb``) and its module file
(Lua, or Tcl), flat or at a hierarchy's levels. No EasyBuild runs: discovery and the plan
only read these files."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence


def _tuple(dep) -> str:
    return repr(tuple(dep))


def install(
    root: Path,
    name: str,
    version: str,
    *,
    dependencies: Sequence = (),
    builddependencies: Sequence = (),
    toolchain: str = "SYSTEM",
    versionsuffix: str = "",
    loads: Sequence[str] = (),
    module: Optional[str] = None,
    tcl: bool = False,
    install_dir: Optional[str] = None,
    easyconfig: Optional[str] = None,
) -> Path:
    """Write one install of ``root`` (an installpath) and its module file; return the install.

    ``install_dir`` is the directory's version part (default: ``version``, which suits the
    SYSTEM toolchain); ``module`` the module's full name (default ``<name>/<install_dir>``);
    ``loads`` what the module file loads; ``easyconfig`` replaces the whole copy's text."""
    directory = install_dir or version
    place = root / "software" / name / directory
    (place / "easybuild").mkdir(parents=True)
    text = easyconfig
    if text is None:
        text = (
            f"name = {name!r}\nversion = {version!r}\n"
            + (f"versionsuffix = {versionsuffix!r}\n" if versionsuffix else "")
            + f"toolchain = {toolchain}\n"
            + f"dependencies = [{', '.join(map(_tuple, dependencies))}]\n"
            + f"builddependencies = [{', '.join(map(_tuple, builddependencies))}]\n"
        )
    (place / "easybuild" / f"{name}-{directory}.eb").write_text(text)
    module_name = module or f"{name}/{directory}"
    module_file = root / "modules" / "all" / (module_name if tcl else module_name + ".lua")
    module_file.parent.mkdir(parents=True, exist_ok=True)
    if tcl:
        lines = ["#%Module", f"set root {place}", *(f"module load {load}" for load in loads)]
    else:
        lines = [f"help([[{name} {version}: module load nothing]])", f'local root = "{place}"']
        lines += [f'depends_on("{load}")' for load in loads]
    module_file.write_text("\n".join(lines) + "\n")
    return place


def flat_chain(root: Path) -> None:
    """libtoy/0.0; two direct dependants (toyapp, toylib); one of a dependant (toptool, of
    toyapp); a build-only dependant (toybuild); an unrelated package (other)."""
    install(root, "libtoy", "0.0")
    install(root, "toyapp", "0.0", dependencies=[("libtoy", "0.0")], loads=["libtoy/0.0"])
    install(root, "toylib", "1.0", dependencies=[("libtoy", "0.0")], loads=["libtoy/0.0"])
    install(root, "toptool", "2.0", dependencies=[("toyapp", "0.0")], loads=["toyapp/0.0"])
    install(root, "toybuild", "3.0", builddependencies=[("libtoy", "0.0")])
    install(root, "other", "1.0")
