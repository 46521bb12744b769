"""An install's easyconfig copy read without running it (``easyconfig.parse``): its literals,
EasyBuild's templates, ``local_`` variables, ``SYSTEM``, toolchains of the package and of its
dependencies, and the refusal of what only running it could tell."""

from __future__ import annotations

import time

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild import easyconfig
from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.easyconfig import Dependency

SYSTEM = ("system", "system")


def _parse(text):
    return easyconfig.parse(text)


def _refusal(text):
    with pytest.raises(easyconfig.EasyconfigError) as raised:
        easyconfig.parse(text)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_literal_fields_and_the_install_directory_easybuild_names():
    parsed = _parse(
        "easyblock = 'ConfigureMake'\n"
        "name = 'HDF5'\nversion = '1.14.3'\nversionsuffix = '-serial'\n"
        "toolchain = {'name': 'gompi', 'version': '2023b'}\n"
        "dependencies = [('zlib', '1.2.13'), ('Szip', '2.1.1', '', ('GCCcore', '13.2.0'))]\n"
        "builddependencies = [('CMake', '3.27.6')]\n"
    )

    assert (parsed.name, parsed.version, parsed.versionsuffix) == ("HDF5", "1.14.3", "-serial")
    assert parsed.toolchain == ("gompi", "2023b")
    assert parsed.install_dir == "1.14.3-gompi-2023b-serial"
    assert parsed.dependencies == [
        Dependency("zlib", "1.2.13"),
        Dependency("Szip", "2.1.1", "", ("GCCcore", "13.2.0")),
    ]
    assert parsed.builddependencies == [Dependency("CMake", "3.27.6")]


def test_system_toolchain_names_no_toolchain_in_the_directory():
    parsed = _parse("name = 'toy'\nversion = '0.0'\ntoolchain = SYSTEM\n")

    assert parsed.toolchain == SYSTEM
    assert parsed.install_dir == "0.0"
    assert parsed.dependencies == []
    assert parsed.builddependencies == []


@pytest.mark.parametrize(
    "spelling",
    ["SYSTEM", "True", "('system', 'system')", "{'name': 'dummy', 'version': ''}"],
)
def test_a_dependency_on_the_system_toolchain_in_each_spelling(spelling):
    parsed = _parse(
        f"name = 'app'\nversion = '1'\ntoolchain = ('GCC', '13.2.0')\n"
        f"dependencies = [('Java', '17', '', {spelling})]\n"
    )

    assert parsed.dependencies == [Dependency("Java", "17", "", SYSTEM)]
    assert parsed.dependencies[0].install_dir(parsed.dependencies[0].toolchain) == "17"


def test_templates_and_local_variables_are_filled_in_as_easybuild_fills_them():
    parsed = _parse(
        "local_pyver = '3.11.5'\n"
        "name = 'numpy'\nversion = '1.26.2'\n"
        "versionsuffix = '-Python-%(pyver)s'\n"
        "toolchain = {'name': 'foss', 'version': '2023b'}\n"
        "local_blas = 'Flexi' + 'BLAS'\n"
        "dependencies = [('Python', local_pyver), (local_blas, '3.3.1'),"
        " ('doc', '%(version_major_minor)s')]\n"
        "builddependencies = [('pybind11', '2.11.1', '-Python-%(pyshortver)s'),"
        " ('%(name)s-tests', '%(version)s')]\n"
    )

    assert parsed.versionsuffix == "-Python-3.11.5"
    assert parsed.install_dir == "1.26.2-foss-2023b-Python-3.11.5"
    assert parsed.dependencies == [
        Dependency("Python", "3.11.5"),
        Dependency("FlexiBLAS", "3.3.1"),
        Dependency("doc", "1.26"),
    ]
    assert parsed.builddependencies == [
        Dependency("pybind11", "2.11.1", "-Python-3.11"),
        Dependency("numpy-tests", "1.26.2"),
    ]


def test_percent_formatting_of_plain_values_is_evaluated():
    parsed = _parse(
        "local_v = '2.1'\nname = 'lib'\nversion = '%s.%d' % (local_v, 4)\ntoolchain = SYSTEM\n"
        "dependencies = [('base', '%(v)s' % {'v': local_v})]\n"
    )

    assert parsed.version == "2.1.4"
    assert parsed.dependencies == [Dependency("base", "2.1")]


def test_hidden_dependencies_and_alternatives_count_as_dependencies():
    parsed = _parse(
        "name = 'app'\nversion = '1'\ntoolchain = SYSTEM\n"
        "hiddendependencies = [('libhidden', '0.1')]\n"
        "builddependencies = [[('Python', '3.11.5')], [('Python', '3.12.1')]]\n"
    )

    assert parsed.dependencies == [Dependency("libhidden", "0.1")]
    assert parsed.builddependencies == [Dependency("Python", "3.11.5"), Dependency("Python", "3.12.1")]


def test_an_external_module_is_no_dependency_of_the_tree():
    parsed = _parse(
        "name = 'app'\nversion = '1'\ntoolchain = SYSTEM\n"
        "dependencies = [('cray-mpich', EXTERNAL_MODULE), ('zlib', '1.3')]\n"
    )

    assert parsed.dependencies == [Dependency("zlib", "1.3")]


def test_an_assignment_not_read_here_may_be_anything():
    parsed = _parse(
        "name = 'app'\nversion = '1'\ntoolchain = SYSTEM\n"
        "sanity_check_paths = {'files': ['bin/%s' % x for x in ['a', 'b']], 'dirs': []}\n"
        "postinstallcmds = [open('/etc/passwd').read()]\n"
    )

    assert parsed.name == "app"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = [", "it is not Python (line"),
        ("name = 'a'\x00\nversion = '1'\n", "it is not Python"),
        ("version = '1'\ntoolchain = SYSTEM\n", "its name is missing"),
        ("name = 'a'\nversion = 1\ntoolchain = SYSTEM\n", "its version is not a string"),
        ("name = 'a'\nversion = '1'\n", "its toolchain is missing or not a literal"),
        ("name = 'a'\nversion = '1'\ntoolchain = ('GCC',)\n", "its toolchain is not a toolchain"),
        (
            "import os\nname = 'a'\nversion = os.environ['V']\ntoolchain = SYSTEM\n",
            "its version is not a literal (a Subscript expression)",
        ),
        (
            "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = [(n, '1') for n in 'ab']\n",
            "its dependencies are not literals (a ListComp expression)",
        ),
        (
            "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = [('z', get_version())]\n",
            "its dependencies are not literals (a Call expression)",
        ),
        (
            "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = ['zlib']\n",
            "dependencies[0] is not a tuple",
        ),
        (
            "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = [('z', '1', '', 'GCC')]\n",
            "dependencies[0]'s toolchain is not a toolchain",
        ),
        (
            "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = [('z', '%(unknownver)s')]\n",
            "uses the template %(unknownver)s, which is not known here",
        ),
    ],
)
def test_what_cannot_be_read_without_running_it_is_refused_in_one_line(text, said):
    assert said in _refusal(text)


def test_nothing_in_the_copy_runs():
    # Were any of it executed, the call would raise (no such name) or the file would appear.
    text = (
        "__import__('os').system('touch /tmp/pwned-by-easyconfig')\n"
        "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\n"
        "dependencies = [('z', '1')] if __import__('os').getuid() else []\n"
    )

    assert "its dependencies are not literals (a IfExp expression)" in _refusal(text)


def test_a_doubling_string_stops_at_the_size_limit_instead_of_filling_memory():
    # 64 doublings of 1 byte: 2**64 bytes, were it evaluated.
    text = "local_x = 'x'\n" + "local_x = local_x + local_x\n" * 64
    text += "name = 'a'\nversion = local_x\ntoolchain = SYSTEM\n"
    started = time.monotonic()

    said = _refusal(text)

    assert "its version is not a literal (a value too long)" in said
    assert time.monotonic() - started < 2


def test_a_format_width_cannot_make_a_short_file_a_huge_string():
    said = _refusal("name = 'a'\nversion = '%0999999999d' % 1\ntoolchain = SYSTEM\n")

    assert "its version is not a literal" in said


def test_repeated_directives_of_a_long_value_are_not_expanded():
    text = "local_x = 'x' + 'x'\n" + "local_x = local_x + local_x\n" * 18  # 512 KiB
    text += "name = 'a'\nversion = '" + "%(x)s" * 8 + "' % {'x': local_x}\n"
    text += "toolchain = SYSTEM\n"

    assert "its version is not a literal" in _refusal(text)


def test_deeply_nested_brackets_are_refused_not_a_crash():
    depth = 100000
    text = "name = 'a'\nversion = '1'\ntoolchain = SYSTEM\ndependencies = " + "[" * depth + "]" * depth + "\n"

    said = _refusal(text)

    assert "it nests too deeply to parse" in said or "it is not Python" in said
