"""Running a module's ``main()`` in the test process and reading back the JSON it printed.

Shared by the module tests of ``tests/unit/plugins/modules/`` (their fixtures are in that
directory's conftest.py) and ``tests/integration/ansible/test_module_staged_rebuild.py``.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args

from tests.support.staged import StagedSite, snapshot

# The package the test builder installs live before each test.
APP = "TinyApp/1.0"


def run_module(capsys, module, args, *, check_mode=False, diff=False) -> dict:
    """Run ``module.main()`` once with ``args``; returns its result.

    Its whole stdout must be one JSON document and its stderr empty, and it must exit as a
    module does: 1 when it failed (fail_json), else 0.
    """
    args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
    # AnsibleModule keeps warnings in a module-level dict that lasts as long as the process:
    # harmless for a module, which is a process of its own, but here every run shares one.
    ansible_warnings._global_warnings.clear()
    capsys.readouterr()  # whatever the test printed before is not the module's output
    # Importing any controller code (a lookup plugin's test does) marks the whole process as
    # the controller, and a module's warnings then go to the controller's display on stderr
    # instead of into its result. A module runs on a managed node, where they are results.
    on_a_managed_node = mock.patch.object(ansible_internal, "is_controller", False)
    with on_a_managed_node, patch_module_args(args), pytest.raises(SystemExit) as exited:
        module.main()
    captured = capsys.readouterr()
    assert captured.err == ""
    result = json.loads(captured.out)
    assert exited.value.code == (1 if result.get("failed") else 0)
    return result


def run_on_site(capsys, module, site: StagedSite, *, check_mode=False, diff=False, **args) -> dict:
    """``run_module`` with the site's state root, unless ``args`` give another; a ``state_root``
    of None leaves the option out, as a task that does not set it."""
    params = {"state_root": str(site.state_root), **args}
    return run_module(capsys, module, params, check_mode=check_mode, diff=diff)


def disk(site: StagedSite) -> dict:
    """The live tree and the state root, entry by entry: equal means nothing on disk changed."""
    return snapshot(site.installpath, site.state_root)


def assert_failed_with(result, message, error=None):
    """The module failed with ``message``, the core's one line, and no traceback; with
    ``error``, the failure's stable kind is that (``usage``, ``journal``, ``lock_held``, ...)."""
    assert result["failed"] is True
    assert result["msg"] == message
    assert "\n" not in result["msg"]
    assert "exception" not in result
    if error is not None:
        assert result["error"] == error


def warnings_of(result) -> list:
    """The texts of a result's warnings: ansible-core 2.19 returns each as a structured event."""
    return [
        warning["event"]["msg"] if isinstance(warning, dict) else warning
        for warning in result.get("warnings", [])
    ]
