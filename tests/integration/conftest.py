"""Fixtures that start or wrap the real components: Lmod, EasyBuild, Slurm, a test user.

Each lives in its own module under ``harness/``; importing them here makes them visible to
every integration test.
"""

from tests.integration.harness.cluster import cephfs, cluster, glusterfs, one_disk
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
