# Copyright: hpcstack.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The core of hpcstack.ops, standard library only; installed with pip, the package ``hpcstack_ops``.

Public API: two commands, not Python names.

- ``eb-staged-rebuild`` (entry point ``staged_rebuild.cli:main``) and ``eessi-arch-guard``
  (entry point ``arch_guard.cli:main``): their command lines, their exit statuses and the
  JSON documents they print with ``--json``, as docs/reference/eb-staged-rebuild.md and
  docs/reference/eessi-arch-guard.md describe them.
- ``common.version.VERSION``: the collection's version (galaxy.yml), which ``--version`` prints.

Everything else here (the subpackages ``common``, ``staged_rebuild`` and ``arch_guard``,
every module, class and function in them, and the entry points' keyword arguments) is
private to the collection: its modules, roles and plugins import it, nothing else should.
It may change in any release, without notice or deprecation. The collection's Ansible
interface (modules, roles, playbooks) is documented in docs/ansible.md.
"""
