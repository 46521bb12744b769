"""Fixtures that start or wrap the real components: Lmod, EasyBuild, Slurm, a test user.

Each lives in its own module under ``harness/``; importing them here makes them visible to
every integration test.

The tests are handed to the xdist workers folder by folder, the staged tests last: hundreds
of them, most under a second, so that the run ends on short tests and neither worker waits
idle for the other's one long test (a molecule scenario, the demo, a role's upgrade).
"""

from pathlib import Path

from tests.integration.harness.cluster import cephfs, cluster, glusterfs, one_disk
from tests.integration.harness.demo import demo_run
from tests.integration.harness.ebsite import built_trees, eb_site_factory
from tests.integration.harness.guard import eessi_prefix, guard_site
from tests.integration.harness.guard_rollout import job_root
from tests.integration.harness.guard_slurm import slurm_guard
from tests.integration.harness.mounts import fuse_dir
from tests.integration.harness.slurm import private_data_jobs, slurm_cluster, slurm_partitions
from tests.integration.harness.stack import easybuild, lmod, tiny_packages
from tests.integration.harness.toysite import environment_modules, toy_material
from tests.support.deep import deep_scratch
from tests.support.locales import en_us_utf8
from tests.support.staged import package_root, staged_site
from tests.support.users import attacker_user, unprivileged_user, user_tmp_path

__all__ = [
    "attacker_user",
    "built_trees",
    "cephfs",
    "cluster",
    "deep_scratch",
    "demo_run",
    "easybuild",
    "eb_site_factory",
    "eessi_prefix",
    "en_us_utf8",
    "environment_modules",
    "fuse_dir",
    "glusterfs",
    "guard_site",
    "job_root",
    "lmod",
    "one_disk",
    "package_root",
    "private_data_jobs",
    "slurm_cluster",
    "slurm_guard",
    "slurm_partitions",
    "staged_site",
    "tiny_packages",
    "toy_material",
    "unprivileged_user",
    "user_tmp_path",
]

HERE = Path(__file__).parent
LAST = "staged"


def pytest_collection_modifyitems(items):
    """The staged folder's tests after every other integration test (a stable sort: the order
    within a folder stays the collection's, the unit tests stay first)."""

    def rank(item) -> int:
        try:
            folder = item.path.relative_to(HERE).parts[0]
        except ValueError:
            return 0  # not an integration test
        return 2 if folder == LAST else 1

    items.sort(key=rank)
