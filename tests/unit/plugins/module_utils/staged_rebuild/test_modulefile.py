"""Module files: reading the root and the dependencies, rewriting the root, publishing with metadata.

The publishing tests use real POSIX ACLs (``setfacl``), a real ``chown`` to ``nobody``, and
real failures: an immutable destination (``chattr +i``) that makes the rename fail, a file
size limit that makes the write fail, and a child process running as ``nobody`` that may not
give the new file its owner or create a file at all. They need root, as CI runs them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import resource
import shutil
import signal
import stat
import string
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ansible_collections.hpcstack.ops.plugins.module_utils.common import errors
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import modulefile

OLD = "/apps/software/TinyApp/1.0"
NEW = "/live/software/TinyApp/1.0"

# What EasyBuild 5.4.1 writes for TinyApp (only the install path differs).
EB_LUA = """help([==[

Description
===========
A tiny self-contained test package (TinyApp).


More information
================
 - Homepage: https://example.org/tinypkgs
]==])

whatis([==[Description: A tiny self-contained test package (TinyApp).]==])
whatis([==[Homepage: https://example.org/tinypkgs]==])
whatis([==[URL: https://example.org/tinypkgs]==])

local root = "/apps/software/TinyApp/1.0"

conflict("TinyApp")

depends_on("TinyLib/1.0")

prepend_path("CMAKE_PREFIX_PATH", root)
prepend_path("PATH", pathJoin(root, "bin"))
prepend_path("XDG_DATA_DIRS", pathJoin(root, "share"))
setenv("EBROOTTINYAPP", root)
setenv("EBVERSIONTINYAPP", "1.0")
setenv("EBDEVELTINYAPP", pathJoin(root, "easybuild", "TinyApp-1.0-easybuild-devel"))

-- Built with EasyBuild version 5.4.1
"""

# The Tcl layout of EasyBuild's ModuleGeneratorTcl: help in a brace word, a guarded load.
EB_TCL = """#%Module
proc ModulesHelp { } {
    puts stderr {
Description
===========
A tiny self-contained test package (TinyApp). Use it with
module load TinyApp/1.0
set root /somewhere/else
    }
}

module-whatis {Description: A tiny self-contained test package (TinyApp).}

set root /apps/software/TinyApp/1.0

conflict TinyApp

if { ![ is-loaded TinyLib/1.0 ] } {
    module load TinyLib/1.0
}

prepend-path\tPATH\t\t$root/bin
setenv\tEBROOTTINYAPP\t\t"$root"
setenv\tEBVERSIONTINYAPP\t\t"1.0"
setenv\tEBDEVELTINYAPP\t\t"$root/easybuild/TinyApp-1.0-easybuild-devel"

# Built with EasyBuild version 4.9.4
"""


# --- parse_root ----------------------------------------------------------------------------


def test_parse_root_reads_the_easybuild_lua_root():
    assert modulefile.parse_root(EB_LUA) == OLD


def test_parse_root_reads_a_single_quoted_lua_root_with_a_trailing_comment():
    assert modulefile.parse_root("local root = '/apps/x/1' -- where it lives\n") == "/apps/x/1"


def test_parse_root_reads_the_easybuild_tcl_root_not_the_one_in_the_help_text():
    assert modulefile.parse_root(EB_TCL) == OLD


@pytest.mark.parametrize(
    "line", ["set root /apps/x/1", 'set root "/apps/x/1"', "set root {/apps/x/1}", "  set  root\t/apps/x/1 ;"]
)
def test_parse_root_reads_tcl_roots_bare_quoted_and_braced(line):
    assert modulefile.parse_root("#%Module\n" + line + "\n") == "/apps/x/1"


def test_parse_root_skips_a_lua_root_in_help_text_and_comments():
    text = 'help([[\nlocal root = "/help"\n]])\n-- local root = "/comment"\nlocal root = "/real"\n'
    assert modulefile.parse_root(text) == "/real"


@pytest.mark.parametrize(
    "text",
    [
        'setenv("EBROOTX", "/apps/x")\n',
        '-- local root = "/apps/x"\n',
        '--[[\nlocal root = "/apps/x"\n]]\n',
        'local root = os.getenv("HOME") .. "/x"\n',
        'local root = "/apps/x" .. suffix\n',
        'local root = "/apps/\\x41"\n',
        'local root = ""\n',
        "set root /apps/x\n",  # Tcl syntax without the #%Module cookie is Lua, and no root
        "#%Module\n# set root /apps/x\n",
        "#%Module\nset root $env(HOME)/x\n",
        '#%Module\nset root "[pwd]/x"\n',
        "#%Module\nproc p {} { set root /apps/x }\n",
        "#%Module\nmodule-whatis {set root /apps/x}\n",
    ],
)
def test_parse_root_is_none_without_a_literal_root_assignment(text):
    assert modulefile.parse_root(text) is None


# --- with_root -----------------------------------------------------------------------------


def test_with_root_changes_only_the_root_line_of_the_easybuild_lua_file():
    rewritten = modulefile.with_root(EB_LUA, NEW)

    assert rewritten == EB_LUA.replace(f'local root = "{OLD}"', f'local root = "{NEW}"')
    assert modulefile.parse_root(rewritten) == NEW


def test_with_root_rewrites_literal_copies_of_the_old_root_too():
    text = (
        f'local root = "{OLD}"\n'
        f'setenv("EBDEVELTINYAPP", "{OLD}/easybuild/TinyApp-1.0-easybuild-devel")\n'
        f'prepend_path("PATH", "{OLD}")\n'
    )
    expected = (
        f'local root = "{NEW}"\n'
        f'setenv("EBDEVELTINYAPP", "{NEW}/easybuild/TinyApp-1.0-easybuild-devel")\n'
        f'prepend_path("PATH", "{NEW}")\n'
    )
    assert modulefile.with_root(text, NEW) == expected


def test_with_root_leaves_longer_names_that_start_or_end_with_the_old_root_alone():
    others = (
        f'setenv("A", "{OLD}.1/bin")\n'
        f'setenv("B", "{OLD}-extra")\n'
        f'setenv("C", "/stage{OLD}")\n'
        f'setenv("D", "{OLD}_x")\n'
    )
    text = f'local root = "{OLD}"\n' + others

    assert modulefile.with_root(text, NEW) == f'local root = "{NEW}"\n' + others


def test_with_root_changes_only_the_root_line_of_the_easybuild_tcl_file():
    rewritten = modulefile.with_root(EB_TCL, NEW)

    assert rewritten == EB_TCL.replace(f"set root {OLD}", f"set root {NEW}")


@pytest.mark.parametrize("written", ["set root {}", 'set root "{}"', "set root {{{}}}", "set root\t{} ;"])
def test_with_root_keeps_the_tcl_quoting(written):
    text = "#%Module\n" + written.format(OLD) + f"\nsetenv EBDEVELX {OLD}/easybuild\n"

    rewritten = modulefile.with_root(text, NEW)

    assert rewritten == "#%Module\n" + written.format(NEW) + f"\nsetenv EBDEVELX {NEW}/easybuild\n"


def test_with_root_keeps_a_single_quoted_lua_root_single_quoted():
    assert modulefile.with_root(f"local root = '{OLD}'\n", NEW) == f"local root = '{NEW}'\n"


def test_with_root_to_the_same_root_returns_the_text_unchanged():
    assert modulefile.with_root(EB_LUA, OLD) == EB_LUA
    assert modulefile.with_root(EB_TCL, OLD) == EB_TCL


def test_with_root_of_slash_rewrites_only_the_assignment():
    text = 'local root = "/"\nsetenv("X", "/usr/bin")\n'

    assert modulefile.with_root(text, NEW) == f'local root = "{NEW}"\nsetenv("X", "/usr/bin")\n'


@pytest.mark.parametrize(
    "text",
    [
        'setenv("EBROOTX", "/apps/x")\n',
        'local root = os.getenv("X")\n',
        "#%Module\nsetenv EBROOTX /apps/x\n",
        "#%Module\nset root $env(X)\n",
    ],
)
def test_with_root_without_a_literal_root_assignment_raises_usage_error(text):
    with pytest.raises(errors.UsageError, match="no literal root assignment"):
        modulefile.with_root(text, NEW)


@pytest.mark.parametrize(
    ("text", "new_root"),
    [
        (EB_LUA, '/live/"x'),
        (EB_LUA, "/live/\\x"),
        (EB_LUA, "/live/x\ny"),
        (EB_LUA, ""),
        (EB_TCL, "/live/with space"),
        (EB_TCL, "/live/$x"),
        (EB_TCL, "/live/[x]"),
        (EB_TCL, "/live/{x"),
    ],
)
def test_with_root_refuses_a_root_that_would_need_quoting(text, new_root):
    with pytest.raises(errors.UsageError, match="would need quoting"):
        modulefile.with_root(text, new_root)


_COMPONENT = st.text(alphabet=string.ascii_letters + string.digits + "._-+", min_size=1, max_size=8)
_ROOTS = st.lists(_COMPONENT, min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts))

_LUA_TEMPLATE = (
    'local root = "{root}"\n'
    'prepend_path("PATH", pathJoin(root, "bin"))\n'
    'setenv("EBDEVELX", "{root}/easybuild/X-1.0-easybuild-devel")\n'
)
_TCL_TEMPLATE = "#%Module\nset root {root}\nprepend-path PATH $root/bin\nsetenv EBDEVELX {root}/easybuild/x\n"


@given(old=_ROOTS, new=_ROOTS, template=st.sampled_from([_LUA_TEMPLATE, _TCL_TEMPLATE]))
def test_with_root_round_trips_between_two_roots(old, new, template):
    assume(old.rstrip("/") != new.rstrip("/"))
    text = template.format(root=old)

    rewritten = modulefile.with_root(text, new)

    assert rewritten == template.format(root=new)
    assert modulefile.parse_root(rewritten) == new
    assert modulefile.with_root(rewritten, old) == text


@given(tail=st.text(), template=st.sampled_from([_LUA_TEMPLATE, _TCL_TEMPLATE]))
def test_with_root_keeps_every_byte_that_does_not_name_the_old_root(tail, template):
    assume(OLD not in tail)
    text = template.format(root=OLD) + tail

    assert modulefile.with_root(text, NEW) == template.format(root=NEW) + tail


# --- dependencies --------------------------------------------------------------------------


def test_dependencies_of_the_easybuild_lua_file():
    assert modulefile.dependencies(EB_LUA) == ["TinyLib/1.0"]


def test_dependencies_of_the_easybuild_tcl_file_skip_the_help_text():
    assert modulefile.dependencies(EB_TCL) == ["TinyLib/1.0"]


def test_dependencies_read_lua_load_with_several_arguments_and_either_quote():
    text = (
        "load('A/1', \"B/2\")\n"
        'if not ( isloaded("C/3") ) then\n    load("C/3")\nend\n'
        'depends_on ( "D/4" ,\n  -- a comment between arguments\n  "E/5" )\n'
        'load("A/1")\n'
    )
    assert modulefile.dependencies(text) == ["A/1", "B/2", "C/3", "D/4", "E/5"]


def test_dependencies_ignore_lua_comments_strings_and_other_calls():
    text = (
        '-- depends_on("Commented/1")\n'
        '--[==[\nload("Block/1")\n]==]\n'
        'help([==[\nLoad it with load("Help/1")\n]==])\n'
        'whatis("load(\\"Whatis/1\\")")\n'
        'try_load("Try/1")\n'
        'unload("Unload/1")\n'
        'lib:load("Method/1")\n'
        'depends_on(between("Between", "1", "2"))\n'
        "load(name)\n"
        'depends_on("Real/1") -- load("Trailing/1")\n'
    )
    assert modulefile.dependencies(text) == ["Real/1"]


def test_dependencies_read_tcl_module_load_depends_on_and_guarded_loads():
    text = (
        "#%Module\n"
        "if { ![ is-loaded A/1 ] } { module load A/1 }\n"
        "if { [ module-info mode remove ] || ![ is-loaded B/2 ] } {\n    module load B/2\n"
        "} elseif { 1 } {\n    module load C/3\n} else {\n    module load D/4\n}\n"
        "module load E/5 F/6 ;# two at once\n"
        "module add G/7\n"
        'depends-on "H/8"\n'
        "module load --tag=keep I/9\n"
    )
    assert modulefile.dependencies(text) == ["A/1", "B/2", "C/3", "D/4", "E/5", "F/6", "G/7", "H/8", "I/9"]


def test_dependencies_ignore_tcl_comments_and_help_text():
    text = (
        "#%Module\n"
        "# module load Commented/1\n"
        "  # module load Indented/1 \\\n    module load Continued/1\n"
        "proc ModulesHelp { } {\n    puts stderr {\nmodule load Help/1\n    }\n}\n"
        "module-whatis {module load Whatis/1}\n"
        "module unload Unloaded/1\n"
        "module load $name\n"
        "module load Real/1\n"
    )
    assert modulefile.dependencies(text) == ["Real/1"]


# A leading "-" would make a Tcl argument an option of ``module load``.
_NAME_PART = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,7}", fullmatch=True)
_NAMES = st.lists(st.tuples(_NAME_PART, _NAME_PART).map("/".join), max_size=6)


@given(active=_NAMES, commented=_NAMES, data=st.data())
def test_dependencies_of_generated_lua_files(active, commented, data):
    lines = [data.draw(st.sampled_from(['depends_on("{}")', "load('{}')"])).format(name) for name in active]
    lines += [f'-- load("{name}")' for name in commented]
    order = data.draw(st.permutations(range(len(lines))))
    text = "\n".join(lines[index] for index in order) + "\n"
    expected = [active[index] for index in order if index < len(active)]

    assert modulefile.dependencies(text) == list(dict.fromkeys(expected))


@given(active=_NAMES, commented=_NAMES, data=st.data())
def test_dependencies_of_generated_tcl_files(active, commented, data):
    forms = ["module load {}", "if {{ ![ is-loaded {0} ] }} {{\n    module load {0}\n}}", "depends-on {}"]
    lines = [data.draw(st.sampled_from(forms)).format(name) for name in active]
    lines += [f"# module load {name}" for name in commented]
    order = data.draw(st.permutations(range(len(lines))))
    text = "#%Module\n" + "\n".join(lines[index] for index in order) + "\n"
    expected = [active[index] for index in order if index < len(active)]

    assert modulefile.dependencies(text) == list(dict.fromkeys(expected))


# --- publish_order -------------------------------------------------------------------------


def _lua(*needs):
    return "".join(f'depends_on("{name}")\n' for name in needs)


def test_publish_order_puts_dependencies_before_dependents():
    modules = {"App/1": _lua("Mid/1"), "Mid/1": _lua("Base/1"), "Base/1": _lua()}

    assert modulefile.publish_order(modules) == ["Base/1", "Mid/1", "App/1"]


def test_publish_order_reads_tcl_and_lua_files_together():
    modules = {"App/1": "#%Module\nmodule load Lib/1\n", "Lib/1": _lua("Zlib/1"), "Zlib/1": "#%Module\n"}

    assert modulefile.publish_order(modules) == ["Zlib/1", "Lib/1", "App/1"]


def test_publish_order_ignores_dependencies_outside_the_set():
    modules = {"B/1": _lua("GCCcore/13.2.0", "A/1"), "A/1": _lua("zlib/1.3")}

    assert modulefile.publish_order(modules) == ["A/1", "B/1"]


def test_publish_order_sorts_independent_modules_by_name():
    assert modulefile.publish_order({"c/1": "", "a/1": "", "B/1": ""}) == ["B/1", "a/1", "c/1"]


def test_publish_order_finishes_a_cycle_in_name_order_without_raising():
    modules = {
        "Zeta/1": _lua("Alpha/1"),
        "Alpha/1": _lua("Mu/1"),
        "Mu/1": _lua("Zeta/1"),
        "After/1": _lua("Mu/1"),
        "Base/1": _lua(),
        "Zeta/2": _lua("Base/1"),
    }
    # Alpha/1 -> Mu/1 -> Zeta/1 -> Alpha/1 is one cycle: its members go together, sorted.
    assert modulefile.publish_order(modules) == ["Alpha/1", "Mu/1", "Zeta/1", "After/1", "Base/1", "Zeta/2"]


def test_publish_order_with_a_cycle_and_a_dependency_of_the_cycle_puts_that_dependency_first():
    modules = {"A/1": _lua("B/1"), "B/1": _lua("A/1", "Z/1"), "Z/1": _lua()}

    assert modulefile.publish_order(modules) == ["Z/1", "A/1", "B/1"]


def test_publish_order_does_not_depend_on_the_order_of_the_dict():
    items = [("A/1", _lua("B/1")), ("B/1", _lua("A/1")), ("C/1", _lua("A/1")), ("D/1", _lua())]

    assert modulefile.publish_order(dict(items)) == modulefile.publish_order(dict(reversed(items)))


def test_publish_order_ignores_a_module_that_loads_itself():
    assert modulefile.publish_order({"A/1": _lua("A/1", "B/1"), "B/1": ""}) == ["B/1", "A/1"]


def test_publish_order_matches_a_bare_name_to_the_versions_in_the_set():
    modules = {"App/1": _lua("Lib"), "Lib/2": "", "Lib/1": ""}

    assert modulefile.publish_order(modules) == ["Lib/1", "Lib/2", "App/1"]


def test_publish_order_of_a_long_chain_does_not_recurse():
    count = 3000
    modules = {f"M{number:05d}/1": _lua(f"M{number + 1:05d}/1") for number in range(count)}

    order = modulefile.publish_order(modules)

    assert order == [f"M{number:05d}/1" for number in reversed(range(count))]


@given(st.sets(_NAME_PART.map(lambda name: name + "/1"), max_size=8), st.data())
def test_publish_order_never_places_a_dependent_before_an_acyclic_dependency(names, data):
    nodes = sorted(names)
    # Edges only towards later names: a random graph without cycles.
    modules = {}
    for index, node in enumerate(nodes):
        later = nodes[index + 1 :]
        modules[node] = _lua(*data.draw(st.lists(st.sampled_from(later), unique=True))) if later else ""

    order = modulefile.publish_order(modules)

    assert sorted(order) == nodes
    for node, text in modules.items():
        for dependency in modulefile.dependencies(text):
            assert order.index(dependency) < order.index(node)


# --- module_hash ---------------------------------------------------------------------------


def test_module_hash_is_the_sha256_hex_of_the_bytes():
    assert modulefile.module_hash(b"local root\n") == hashlib.sha256(b"local root\n").hexdigest()
    assert modulefile.module_hash("r\u00e9") == hashlib.sha256("r\u00e9".encode()).hexdigest()


# --- publishing: helpers -------------------------------------------------------------------

POSIX_ACL = "system.posix_acl_access"
NOBODY = pwd.getpwnam("nobody")


def _setfacl(*args):
    return subprocess.run(["setfacl", *args], capture_output=True, text=True, check=False)


def _getfacl(path):
    done = subprocess.run(
        ["getfacl", "--omit-header", os.fspath(path)], capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture
def module_dir():
    """A directory on a filesystem where a real ``setfacl`` works, traversable by ``nobody``.

    Not ``tmp_path``: its parents are mode 0700, which keeps out the tests' child processes
    running as ``nobody``. The system temporary directory comes first (where ``tmp_path``
    lives), then /dev/shm (tmpfs supports POSIX ACLs).
    """
    for base in (tempfile.gettempdir(), "/dev/shm"):
        directory = tempfile.mkdtemp(prefix="modulefile-", dir=base)
        os.chmod(directory, 0o755)  # noqa: S103 - the children running as nobody must traverse it
        probe = os.path.join(directory, "probe")
        Path(probe).touch()
        accepted = _setfacl("-m", "u:nobody:r", probe).returncode == 0
        os.unlink(probe)
        if accepted:
            break
        shutil.rmtree(directory)
    else:
        pytest.fail("neither the temporary directory nor /dev/shm accepts POSIX ACLs")
    yield Path(directory)
    shutil.rmtree(directory)


def _live_file(directory, data=b"old module\n", mode=0o640, owner=NOBODY, acl="u:nobody:r"):
    path = directory / "1.0.lua"
    path.write_bytes(data)
    os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chmod(path, mode)
    if acl:
        done = _setfacl("-m", acl, str(path))
        assert done.returncode == 0, done.stderr
    return path


def _state(path):
    """Everything a failed replace must leave as it was."""
    return path.read_bytes(), os.lstat(path).st_ino, modulefile.read_metadata(path), _getfacl(path)


def _in_child(action, user=None, file_size_limit=None):
    """Run ``action()`` in a forked child, as ``user`` or under a file size limit; its outcome as text.

    A fork rather than a subprocess: the child runs the module already imported here, and
    the limit and the identity change must not touch the test process.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read_end)
            if file_size_limit is not None:
                # Without SIG_IGN the kernel kills the writer instead of failing the write.
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
            if user is not None:
                os.setgroups([])
                os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
                os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
            try:
                action()
                outcome = "ok"
            except BaseException as err:
                outcome = f"{type(err).__name__}: {err}"
            os.write(write_end, outcome.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as stream:
        outcome = stream.read().decode()
    os.waitpid(pid, 0)
    return outcome


def test_module_dir_accepts_a_real_posix_acl(module_dir):
    path = _live_file(module_dir)

    assert "user:nobody:r--" in _getfacl(path)
    assert os.getxattr(path, POSIX_ACL)


# --- read_metadata -------------------------------------------------------------------------


def test_read_metadata_reports_owner_mode_and_acl_bytes_as_hex(module_dir):
    path = _live_file(module_dir)

    metadata = modulefile.read_metadata(path)

    assert metadata == {
        "uid": NOBODY.pw_uid,
        "gid": NOBODY.pw_gid,
        "mode": 0o640,
        "xattrs": {POSIX_ACL: os.getxattr(path, POSIX_ACL).hex()},
    }


def test_read_metadata_leaves_out_absent_attributes(module_dir):
    path = _live_file(module_dir, acl=None)

    assert modulefile.read_metadata(path)["xattrs"] == {}


def test_read_metadata_refuses_a_symlink(module_dir):
    target = _live_file(module_dir)
    (module_dir / "link.lua").symlink_to(target)

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        modulefile.read_metadata(module_dir / "link.lua")


def test_read_metadata_refuses_a_directory(module_dir):
    with pytest.raises(errors.UsageError, match="not a regular file"):
        modulefile.read_metadata(module_dir)


def test_read_metadata_of_a_missing_file_raises_file_not_found(module_dir):
    with pytest.raises(FileNotFoundError):
        modulefile.read_metadata(module_dir / "missing.lua")


# --- replace_keeping_metadata: success -----------------------------------------------------


def test_replace_keeps_owner_mode_and_acl_bytes(module_dir):
    path = _live_file(module_dir, mode=0o640, owner=NOBODY, acl="u:nobody:r,g:nogroup:r")
    before = _state(path)
    acl_bytes = os.getxattr(path, POSIX_ACL)

    modulefile.replace_keeping_metadata(path, b"new module\n")

    info = os.lstat(path)
    assert path.read_bytes() == b"new module\n"
    assert info.st_ino != before[1]
    assert (info.st_uid, info.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert stat.S_IMODE(info.st_mode) == 0o640
    assert os.getxattr(path, POSIX_ACL) == acl_bytes
    assert modulefile.read_metadata(path) == before[2]
    assert _getfacl(path) == before[3]


def test_replace_keeps_a_mode_without_acl(module_dir):
    path = _live_file(module_dir, mode=0o604, owner=pwd.getpwuid(0), acl=None)

    modulefile.replace_keeping_metadata(path, b"new\n")

    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o604
    assert modulefile.read_metadata(path)["xattrs"] == {}


def test_replace_removes_an_acl_the_directory_default_acl_would_add(module_dir):
    path = _live_file(module_dir, acl=None)
    done = _setfacl("-d", "-m", "u:nobody:rw", str(module_dir))
    assert done.returncode == 0, done.stderr
    before = _state(path)

    modulefile.replace_keeping_metadata(path, b"new\n")

    assert modulefile.read_metadata(path) == before[2]
    assert _getfacl(path) == before[3]
    assert "user:nobody" not in _getfacl(path)


def test_replace_leaves_only_the_destination_in_the_directory(module_dir):
    path = _live_file(module_dir)

    modulefile.replace_keeping_metadata(path, b"new\n")

    assert os.listdir(module_dir) == ["1.0.lua"]


def test_replace_creates_a_missing_file_with_mode_0644_whatever_the_umask(module_dir):
    path = module_dir / "2.0.lua"
    previous = os.umask(0o077)
    try:
        modulefile.replace_keeping_metadata(path, b"first\n")
    finally:
        os.umask(previous)

    assert path.read_bytes() == b"first\n"
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o644
    assert os.listdir(module_dir) == ["2.0.lua"]


def test_replace_as_the_owner_without_root_keeps_metadata_without_chown(module_dir):
    directory = module_dir / "owned"
    directory.mkdir()
    os.chown(directory, NOBODY.pw_uid, NOBODY.pw_gid)
    path = _live_file(directory, mode=0o640, owner=NOBODY, acl="u:root:r")
    before = _state(path)

    outcome = _in_child(lambda: modulefile.replace_keeping_metadata(path, b"by nobody\n"), user=NOBODY)

    assert outcome == "ok"
    assert path.read_bytes() == b"by nobody\n"
    assert modulefile.read_metadata(path) == before[2]
    assert _getfacl(path) == before[3]


# --- replace_keeping_metadata: refusals and failures ---------------------------------------


def test_replace_refuses_a_symlink_and_leaves_its_target_alone(module_dir):
    target = _live_file(module_dir)
    link = module_dir / "link.lua"
    link.symlink_to(target)
    before = _state(target)

    with pytest.raises(errors.UsageError, match=r"link\.lua is a symbolic link"):
        modulefile.replace_keeping_metadata(link, b"new\n")

    assert _state(target) == before
    assert os.readlink(link) == str(target)
    assert sorted(os.listdir(module_dir)) == ["1.0.lua", "link.lua"]


def test_replace_refuses_a_dangling_symlink_and_creates_nothing(module_dir):
    link = module_dir / "link.lua"
    link.symlink_to(module_dir / "elsewhere.lua")

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        modulefile.replace_keeping_metadata(link, b"new\n")

    assert os.listdir(module_dir) == ["link.lua"]


def test_replace_refuses_a_directory_at_the_path(module_dir):
    (module_dir / "1.0.lua").mkdir()

    with pytest.raises(errors.UsageError, match="not a regular file"):
        modulefile.replace_keeping_metadata(module_dir / "1.0.lua", b"new\n")

    assert os.listdir(module_dir) == ["1.0.lua"]


def test_failed_rename_onto_an_immutable_file_keeps_it_and_removes_the_temp_file(module_dir):
    path = _live_file(module_dir)
    before = _state(path)
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        with pytest.raises(PermissionError) as raised:
            modulefile.replace_keeping_metadata(path, b"new\n")
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)

    assert raised.value.errno == errno.EPERM
    assert _state(path) == before
    assert os.listdir(module_dir) == ["1.0.lua"]


def test_failed_write_over_the_file_size_limit_keeps_the_file_and_removes_the_temp_file(module_dir):
    path = _live_file(module_dir)
    before = _state(path)

    outcome = _in_child(
        lambda: modulefile.replace_keeping_metadata(path, b"x" * (1 << 20)), file_size_limit=1 << 16
    )

    assert outcome.startswith("OSError: [Errno 27]")  # EFBIG
    assert _state(path) == before
    assert os.listdir(module_dir) == ["1.0.lua"]


def test_replace_that_may_not_keep_the_owner_raises_publish_error_and_changes_nothing(module_dir):
    directory = module_dir / "shared"
    directory.mkdir()
    os.chown(directory, NOBODY.pw_uid, NOBODY.pw_gid)
    path = _live_file(directory, mode=0o644, owner=pwd.getpwuid(0))
    before = _state(path)

    outcome = _in_child(lambda: modulefile.replace_keeping_metadata(path, b"by nobody\n"), user=NOBODY)

    assert outcome.startswith(f"PublishError: cannot give the new {path} the owner 0:0")
    assert "nothing was replaced" in outcome
    assert _state(path) == before
    assert os.listdir(directory) == ["1.0.lua"]


def test_replace_in_a_directory_the_writer_cannot_write_changes_nothing(module_dir):
    path = _live_file(module_dir, mode=0o666, owner=NOBODY, acl=None)
    before = _state(path)

    outcome = _in_child(lambda: modulefile.replace_keeping_metadata(path, b"by nobody\n"), user=NOBODY)

    assert outcome.startswith("PermissionError: [Errno 13]")
    assert _state(path) == before
    assert os.listdir(module_dir) == ["1.0.lua"]


def test_replace_in_a_removed_directory_raises_and_creates_nothing(module_dir):
    directory = module_dir / "gone"
    directory.mkdir()
    directory.rmdir()

    with pytest.raises(FileNotFoundError):
        modulefile.replace_keeping_metadata(directory / "1.0.lua", b"new\n")

    assert os.listdir(module_dir) == []


# --- restore_file --------------------------------------------------------------------------


def _backup(directory, data=b"old module\n"):
    path = directory / "backup.lua"
    path.write_bytes(data)
    return path


def test_restore_file_puts_the_backup_back_with_the_metadata_of_the_current_file(module_dir):
    path = _live_file(module_dir, data=b"new module\n")
    before = _state(path)
    backup = module_dir / "backup"
    backup.mkdir()

    modulefile.restore_file(_backup(backup, b"old module\n"), path)

    assert path.read_bytes() == b"old module\n"
    assert modulefile.read_metadata(path) == before[2]
    assert _getfacl(path) == before[3]


def test_restore_file_recreates_a_missing_file_from_a_recorded_metadata(module_dir):
    path = _live_file(module_dir)
    recorded = modulefile.read_metadata(path)
    facl = _getfacl(path)
    backup = module_dir / "backup"
    backup.mkdir()
    backup_file = _backup(backup)
    path.unlink()

    modulefile.restore_file(backup_file, path, metadata=recorded)

    assert path.read_bytes() == b"old module\n"
    assert modulefile.read_metadata(path) == recorded
    assert _getfacl(path) == facl


def test_restore_file_without_a_record_or_a_current_file_creates_mode_0644(module_dir):
    backup = module_dir / "backup"
    backup.mkdir()
    path = module_dir / "1.0.lua"

    modulefile.restore_file(_backup(backup), path)

    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o644
    assert path.read_bytes() == b"old module\n"


def test_restore_file_with_a_record_whose_mode_contradicts_its_acl_raises_and_changes_nothing(module_dir):
    path = _live_file(module_dir, mode=0o640, acl="u:nobody:r")
    before = _state(path)
    record = dict(before[2], mode=0o600)  # group bits 0 while the ACL mask grants r
    backup = module_dir / "backup"
    backup.mkdir()

    with pytest.raises(errors.PublishError, match=r"does not keep system\.posix_acl_access of the file"):
        modulefile.restore_file(_backup(backup, b"other\n"), path, metadata=record)

    assert _state(path) == before
    assert sorted(os.listdir(module_dir)) == ["1.0.lua", "backup"]


def test_restore_file_with_acl_bytes_the_kernel_refuses_raises_and_changes_nothing(module_dir):
    path = _live_file(module_dir)
    before = _state(path)
    record = dict(before[2], xattrs={POSIX_ACL: "02000000ffff"})
    backup = module_dir / "backup"
    backup.mkdir()

    with pytest.raises(
        errors.PublishError, match=r"cannot copy system\.posix_acl_access to the new .*1\.0\.lua"
    ):
        modulefile.restore_file(_backup(backup, b"other\n"), path, metadata=record)

    assert _state(path) == before
    assert sorted(os.listdir(module_dir)) == ["1.0.lua", "backup"]


def test_restore_file_with_an_acl_name_the_filesystem_lacks_raises_and_changes_nothing(module_dir):
    path = _live_file(module_dir)
    before = _state(path)
    record = dict(before[2], xattrs={"gpfs.acl": "00"})
    backup = module_dir / "backup"
    backup.mkdir()

    with pytest.raises(errors.PublishError, match=r"cannot copy gpfs\.acl"):
        modulefile.restore_file(_backup(backup, b"other\n"), path, metadata=record)

    assert _state(path) == before


def test_restore_file_refuses_a_symlinked_backup(module_dir):
    path = _live_file(module_dir)
    before = _state(path)
    backup = module_dir / "backup"
    backup.mkdir()
    (backup / "link.lua").symlink_to(_backup(backup))

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        modulefile.restore_file(backup / "link.lua", path)

    assert _state(path) == before


def test_restore_file_refuses_a_symlink_at_the_destination(module_dir):
    target = _live_file(module_dir)
    before = _state(target)
    link = module_dir / "link.lua"
    link.symlink_to(target)
    backup = module_dir / "backup"
    backup.mkdir()

    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        modulefile.restore_file(_backup(backup), link)
    with pytest.raises(errors.UsageError, match="is a symbolic link"):
        modulefile.restore_file(backup / "backup.lua", link, metadata=before[2])

    assert _state(target) == before
    assert os.readlink(link) == str(target)
