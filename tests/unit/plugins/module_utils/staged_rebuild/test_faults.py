"""``faults.Faults``: the counting fault harness, and the errno a full or read-only disk gives."""

from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.hpcstack.ops.plugins.module_utils.staged_rebuild.faults import (
    Faults,
    InjectedFailure,
)


def test_without_an_errno_the_injected_failure_is_eio_and_names_its_point():
    plan = Faults(fail_at=2)
    plan.before("swap TinyApp/1.0")

    with pytest.raises(InjectedFailure) as raised:
        plan.before("journal swap TinyApp/1.0")

    assert raised.value.errno == errno.EIO
    assert raised.value.strerror == "injected failure before journal swap TinyApp/1.0"
    assert raised.value.step == "journal swap TinyApp/1.0"
    assert plan.operations == ["swap TinyApp/1.0", "journal swap TinyApp/1.0"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["ENOSPC", "EROFS"])
def test_with_an_errno_the_failure_is_that_of_a_full_or_read_only_disk_in_the_kernel_s_words(code):
    plan = Faults(fail_at=1, errno=code)

    with pytest.raises(OSError) as raised:
        plan.before("module TinyApp/1.0")

    assert isinstance(raised.value, InjectedFailure)
    assert raised.value.step == "module TinyApp/1.0"
    assert (raised.value.errno, raised.value.strerror) == (code, os.strerror(code))
    assert str(raised.value) == f"[Errno {code}] {os.strerror(code)}"


def test_a_counting_plan_never_fails():
    plan = Faults(errno=errno.ENOSPC)

    for index in range(5):
        plan.before(f"step {index}")

    assert len(plan.operations) == 5
