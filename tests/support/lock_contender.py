"""One contender of the lock probe, in a process of its own (on a node of the cluster, or as
the other "node" of two views of one directory).

    python3 lock_contender.py PACKAGE STATE_ROOT LOCK HOST PROBE_ID ROUNDS HOLD

``lockprobe.contend`` itself, with the real ``StateLock`` (LOCK ``full``), with a lock that takes
only the flock on ``.lock`` (``flock-only``, as the 0.2.0 publisher does), or with no lock at all
(``none``, the control). Everything else (the meet in ``ready/``, the marker, ``done/`` and the
clean-up) is the probe's own code, so the lock is the only difference. ``PACKAGE`` is the
directory that holds ``hpcstack_ops``. Prints the probe's result as JSON.
"""

import fcntl
import json
import os
import sys
import types


class FlockOnly:
    def __init__(self, state_root, timeout):
        self.path = os.path.join(state_root, locking.LOCK_NAME)

    def __enter__(self):
        self.fd = locking.open_creating(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class NoLock:
    def __init__(self, state_root, timeout):
        pass

    def __enter__(self):
        pass

    def __exit__(self, *exc_info):
        pass


if __name__ == "__main__":
    package, state_root, lock, host, probe_id, rounds, hold = sys.argv[1:8]
    sys.path.insert(0, package)
    from hpcstack_ops.staged_rebuild import locking, lockprobe

    if lock != "full":
        lockprobe.locking = types.SimpleNamespace(StateLock={"flock-only": FlockOnly, "none": NoLock}[lock])
    result = lockprobe.contend(
        state_root, host, probe_id, 2, rounds=int(rounds), hold_seconds=float(hold), wait_seconds=60
    )
    print(json.dumps(result))
