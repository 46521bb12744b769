"""A stand-in for ``eb`` that builds instantly: it behaves like EasyBuild towards the engine.

It takes the install-path options eb-staged-rebuild passes (``--installpath-software``,
``--installpath-modules``, ``--installpath``; ``--opt=value`` or ``--opt value``) and one
positional ``Name-version.eb`` per module, and writes for each
``<software>/Name/version/PAYLOAD`` (and ``easybuild/Name-version.eb``), a Lua module file
``<modules>/all/Name/version.lua`` whose ``root`` is the install dir, and a module-class link
``<modules>/tools/Name/version.lua``, as EasyBuild does. Other options are ignored.
With ``--show-config`` it prints its options in EasyBuild's ``--show-config`` form (``name
(C) = value``) and exits without building, as EasyBuild does.

Switches, from the environment (eb-staged-rebuild passes its environment on):
  FAKE_EB_PAYLOAD=TEXT          what PAYLOAD holds (default "new build")
  FAKE_EB_DEPENDS=A/1:B/2,...   module A/1 gets depends_on("B/2"), its easyconfig copy the dependency
  FAKE_EB_EVIDENCE=none         write no PAYLOAD and no easybuild/*.eb
  FAKE_EB_FAIL=1                write a partial tree, then exit 1
  FAKE_EB_WRITE_OUTSIDE=PATH    also write PATH (a hook escaping its install path)
  FAKE_EB_HANG=1                sleep until killed
  FAKE_EB_GATE=DIR              before building, create DIR/started and wait until DIR/go exists
  FAKE_EB_ARGS_LOG=PATH         append the argument list, one JSON line per build (not for --show-config)
  FAKE_EB_HELP_HEX=HEX          bytes (hex) put into each module file's help text, as they are
  FAKE_EB_DEEP=N                also leave a chain of N nested directories (deep/d/d/...) in
                                each install, before FAKE_EB_FAIL fails it
"""

import json
import os
import re
import sys
import time


def parse(argv):
    options, positional = {}, []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith("--installpath"):
            if "=" in arg:
                name, value = arg.split("=", 1)
            else:
                name, value = arg, argv[index + 1]
                index += 1
            options[name] = value
        elif not arg.startswith("-"):
            positional.append(arg)
        index += 1
    return options, positional


def nest(install, levels):
    """``install/deep/d/d/...``, ``levels`` deep, made through directory descriptors: a path that
    long is more than the kernel resolves (PATH_MAX) once it passes about 2,000 levels."""
    fd = os.open(install, os.O_RDONLY | os.O_DIRECTORY)
    name = "deep"
    for _level in range(levels):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, name = child, "d"
    os.close(fd)


def wait_at_gate(gate):
    """A test holds the build here, and so the run and its lock, for as long as it needs."""
    if gate:
        open(os.path.join(gate, "started"), "w").close()
        while not os.path.exists(os.path.join(gate, "go")):
            time.sleep(0.02)


def show_config(argv):
    print("#\n# Current EasyBuild configuration\n#")
    options, _easyconfigs = parse(argv)
    for name, value in sorted(options.items()):
        print(f"{name[2:]:<40} (C) = {value}")
    return 0


def main(argv):
    return show_config(argv) if "--show-config" in argv else build(argv)


def build(argv):
    if os.environ.get("FAKE_EB_ARGS_LOG"):
        with open(os.environ["FAKE_EB_ARGS_LOG"], "a") as log:
            log.write(json.dumps(argv) + "\n")
    if os.environ.get("FAKE_EB_HANG"):
        while True:
            time.sleep(60)
    options, easyconfigs = parse(argv)
    installpath = options.get("--installpath")
    software = options.get("--installpath-software") or os.path.join(installpath, "software")
    modules = options.get("--installpath-modules") or os.path.join(installpath, "modules")
    depends = {}
    for pair in filter(None, os.environ.get("FAKE_EB_DEPENDS", "").split(",")):
        module, dependency = pair.split(":")
        depends.setdefault(module, []).append(dependency)
    if os.environ.get("FAKE_EB_WRITE_OUTSIDE"):
        with open(os.environ["FAKE_EB_WRITE_OUTSIDE"], "w") as escaped:
            escaped.write("written outside the install path\n")
    if easyconfigs:
        wait_at_gate(os.environ.get("FAKE_EB_GATE"))
    for easyconfig in easyconfigs:
        match = re.match(r"^(?:.*/)?([^/-]+)-(.+)\.eb$", easyconfig)
        if not match:
            sys.stderr.write(f"fake-eb: cannot parse easyconfig name {easyconfig}\n")
            return 1
        name, version = match.groups()
        install = os.path.join(software, name, version)
        print(f"== building and installing {name}/{version}...", flush=True)
        os.makedirs(os.path.join(install, "easybuild"), exist_ok=True)
        if os.environ.get("FAKE_EB_DEEP"):
            nest(install, int(os.environ["FAKE_EB_DEEP"]))
        if os.environ.get("FAKE_EB_FAIL"):
            sys.stderr.write(f"fake-eb: build of {name}/{version} failed (FAKE_EB_FAIL)\n")
            return 1
        if os.environ.get("FAKE_EB_EVIDENCE") != "none":
            with open(os.path.join(install, "PAYLOAD"), "w") as payload:
                payload.write(os.environ.get("FAKE_EB_PAYLOAD", "new build") + "\n")
            with open(os.path.join(install, "easybuild", f"{name}-{version}.eb"), "w") as ec:
                # As EasyBuild keeps it: the easyconfig's name, version, toolchain and dependencies.
                dependencies = [tuple(dep.split("/")) for dep in depends.get(f"{name}/{version}", [])]
                ec.write(
                    f"name = {name!r}\nversion = {version!r}\ntoolchain = SYSTEM\n"
                    f"dependencies = {dependencies!r}\n"
                )
        lines = [f"help([[Fake build of {name}/{version}]])", f'local root = "{install}"']
        lines += [f'depends_on("{dep}")' for dep in depends.get(f"{name}/{version}", [])]
        lines += ['prepend_path("PATH", pathJoin(root, "bin"))', f'setenv("EBROOT{name.upper()}", root)']
        module_file = os.path.join(modules, "all", name, version + ".lua")
        os.makedirs(os.path.dirname(module_file), exist_ok=True)
        # The root as the path's bytes, as EasyBuild writes it (an install path need not be UTF-8).
        text = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
        # A description in Latin-1 (or any bytes): what a real easyconfig's text can hold.
        text = text.replace(
            b"Fake build", b"Fake build " + bytes.fromhex(os.environ.get("FAKE_EB_HELP_HEX", "")), 1
        )
        with open(module_file, "wb") as handle:
            handle.write(text)
        class_link = os.path.join(modules, "tools", name, version + ".lua")
        os.makedirs(os.path.dirname(class_link), exist_ok=True)
        if os.path.lexists(class_link):
            os.unlink(class_link)
        os.symlink(module_file, class_link)
        print("== COMPLETED: Installation ended successfully", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
