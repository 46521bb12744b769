# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's version, which both commands print with ``--version``.

Kept equal to galaxy.yml's version by a test; pyproject.toml reads it for the pip package.
A module of its own, not an attribute of the package: Ansible's packaging of a module finds
module_utils code by module name, and the guard imports it only for ``--version``, so its
TaskProlog path imports nothing more.
"""

VERSION = "0.1.0"
