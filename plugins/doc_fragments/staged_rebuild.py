# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options every staged-rebuild module shares: the state root and its lock."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  state_root:
    description:
      - The directory of the journals, the lock and the retired module files of one live tree
        (one state root per live tree).
      - When not given, the target host's environment variable E(EB_STAGED_REBUILD_STATE_ROOT).
    type: path
  lock_timeout:
    description:
      - Seconds to wait for the state-root lock when another run holds it; V(0) refuses at once.
    type: float
    default: 0
notes:
  - The module runs the collection's C(eb-staged-rebuild) core on the target host; an error
    comes back as the command's one-line message. See C(docs/staged-rebuild.md) for the
    guarantees of each step.
"""

    ATTRIBUTES = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    # The attributes of a module that only reads (with ATTRIBUTES, their descriptions).
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: The module only reads, in check mode as in a normal run.
  diff_mode:
    support: none
  idempotent:
    support: full
    description: The module never reports a change.
"""
