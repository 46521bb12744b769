"""What the guard's cluster tests share: one guard root on the session's cluster.

The EESSI-like repository, the collection's link and Ansible's home (with the SSH
connections its plays keep open) are made once per worker and serve every file of the
guard's group, each of which leaves the nodes as it found them.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration.harness.cluster_guard import ClusterGuard, guard_root


@pytest.fixture(scope="session")
def cluster_guard(cluster, lmod) -> Iterator[ClusterGuard]:
    with guard_root(cluster, lmod) as site:
        yield site
