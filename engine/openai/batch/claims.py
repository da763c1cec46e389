"""Which replica runs a job, when several share one `--batch-dir` (`--batch-shared`): the one that holds an
exclusive POSIX record lock (`fcntl.lockf`) on the job's `<batch id>.lock`, taken without waiting. The lock
manager grants it to one process at a time, and releases it when the holder closes the file, exits or is
killed (on NFSv4 and EFS, when the server's lease on a dead client's state runs out, about 90 s), so a job
whose replica died is taken over by the next replica that tries (the runner's sweep), and no two replicas
run it at once while the holder lives, however long it stalls.

The assumption: the shared volume implements POSIX record locks across machines and releases a dead
holder's (a local disk; NFSv4, EFS, Filestore, Azure Files NFS; CephFS; not NFSv3 mounted `nolock`, not
object-store FUSE mounts such as s3fs or gcsfuse). `Claims` checks at start that locks can be taken at all
and refuses to start shared otherwise.

A process's record locks on a file go away when it closes *any* descriptor of that file, so a lock file is
opened by this object only, once per claim, and closed only to release it. Without `--batch-shared` every
claim succeeds without touching the disk: one server owns its folder.

Called on the loop by the runner (a claim is an open and a non-blocking lock: no waiting on other replicas).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path


class ClaimsUnsupported(RuntimeError):
    """The batch folder's file system refuses record locks: it cannot be shared between replicas."""


class Claims:
    def __init__(self, root: Path, shared: bool) -> None:
        self.root = root
        self.shared = shared
        self._held: dict[str, int] = {}  # batch id → the descriptor that holds its lock
        if shared:
            self._probe()

    def try_claim(self, batch_id: str) -> bool:
        """Hold `batch_id`'s lock (True), or False while another process holds it."""
        if not self.shared or batch_id in self._held:
            return True
        fd = os.open(self.root / f"{batch_id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        self._held[batch_id] = fd
        return True

    def holds(self, batch_id: str) -> bool:
        return not self.shared or batch_id in self._held

    def release(self, batch_id: str) -> None:
        fd = self._held.pop(batch_id, None)
        if fd is not None:
            os.close(fd)  # the lock goes with the descriptor

    def release_all(self) -> None:
        for batch_id in list(self._held):
            self.release(batch_id)

    def forget(self, batch_id: str) -> None:
        """The job is forgotten (an owner's oldest finished job): its lock file goes too."""
        self.release(batch_id)
        with contextlib.suppress(FileNotFoundError):
            (self.root / f"{batch_id}.lock").unlink()

    def _probe(self) -> None:
        path = self.root / ".claims-probe.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):  # another replica probing holds it: locks work
                raise ClaimsUnsupported(
                    f"--batch-shared: the file system of {self.root} refuses POSIX record locks ({e}); jobs "
                    "cannot be claimed by one replica. Use a volume with working locks (NFSv4, CephFS, a "
                    "local disk) or run one replica without --batch-shared.") from e
        finally:
            os.close(fd)
