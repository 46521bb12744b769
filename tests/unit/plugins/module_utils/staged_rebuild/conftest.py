"""The unprivileged build user, for the tests whose behaviour differs from root's (sealed
modes, user namespaces)."""

from tests.integration.harness.users import unprivileged_user

__all__ = ["unprivileged_user"]
