"""Triton's system shared memory extension: the registry of clients' POSIX shared-memory regions.

A client makes an object with `shm_open` (`/dev/shm/<key>`), registers a named range of it (`register`), and
then names the region, an offset and a byte size in a request's tensor parameters instead of sending the
bytes: inputs are read from it, outputs written into it (requests.py). Off unless the server was
started with `--allow-client-shm`: Triton made it opt-in after client shared memory gave it a CVE chain.

One registry per server, owned by the DataPlane, so with `--workers N` it lives in the engine process: the
frontends forward register, unregister and status as they came, with the caller (workers/control.py), and the
engine reads and writes the regions when it handles a request, so a region registered through one frontend is
usable from every other.

**Whose regions.** The registry is scoped by API key (engine/access/caller.py `Caller.owner`): a key's status
lists its own regions only, its requests find only its own, its unregister (one or all) drops only its own,
and two keys may use the same region name. A server without keys has one owner.

**Which objects.** A key names any object in /dev/shm, and the server's user can open objects the client's
user cannot (another user's 0600 object, when the server runs as root; any object of the server's own user),
so the server opens an object for a client only if it may (`register`):
- the object is owned by the user who owns the client's socket (socket_owner.py asks the kernel,
  for a client on this machine): a client reaches through the server only what it could open itself; or
- its key starts with a prefix the operator allowed (`--client-shm-prefix`, repeatable; none by default):
  for clients the kernel cannot name (another machine sharing /dev/shm, another network namespace) or
  objects made by another user on purpose.
A client that fits neither is refused before anything is opened. perf_analyzer and tritonclient's examples
run on the server's machine with objects of their own user, so they register as before.

**How many.** Each region holds one descriptor while registered: at most `--client-shm-max-regions` (256)
regions server-wide, never more than a quarter of the process's open-file limit at the time (so regions
cannot take the descriptors connections need), and `--client-shm-max-regions-per-key` (64) per API key on a
server with keys; past either, RESOURCE_EXHAUSTED (HTTP 429, gRPC UNAVAILABLE) in Triton's register words.

**Why pread/pwrite and not a mapping.** A client owns its object and can `ftruncate` it smaller while it is
registered; a read or write through a mapping of the lost pages is SIGBUS, which kills the whole server, and
no check before the access closes the window (the backend reads an input on an instance thread, long after
any check). `MAP_POPULATE` does not help: truncation unmaps populated pages too. A client object cannot be
sealed by us either. So a region is an open fd and is only ever accessed with `os.preadv` / `os.pwrite`:
past the end of a truncated object those return short counts, never fault, and a short count is a clean
error. Each access first `stat`s the key, so an object removed with `shm_unlink` (or replaced under the same
key) is an error too, rather than a read of memory the client has let go. The cost is one copy of each input,
made by the kernel straight into the array the backend is given (no intermediate buffer), the same one copy
a socket's receive makes; outputs are written from the backend's own arrays.

A region stays open while a request that uses it is in flight: unregistering drops it from the registry (new
requests no longer find it), and its fd is closed when the last request holding it is done, as Triton
defers an unregister until its in-flight requests complete; a closed fd number is never written through.

CUDA regions (cuda.py) are a registry of their own beside this one, sharing its switch and limits; a name is
one region's, of either kind (`cuda_holds`), as in Triton's one map.

Errors are Triton's (server src/shared_memory_manager.cc, src/http_server.cc, src/grpc/grpc_server.cc) where
Triton has them, in its words and codes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..access.caller import NOBODY, Caller
from ..errors import EngineError, ErrorCode, invalid, not_found
from .regions import SHM_ROOT, check_key
from .socket_owner import client_uid

# Triton's words when client shared memory is off (server src/common.h kClientShmDisabledErrorStr), with
# hubserve's flag: `--allow-client-shm` (Triton's spelling, `--allow-client-shm=true`, works too).
DISABLED_MESSAGE = ("Client shared memory is disabled. Start the server with '--allow-client-shm' (or "
                    "'--allow-client-shm=true') to enable.")
# Keys Triton keeps for its own regions (server src/common.h kTritonSharedMemoryRegionPrefix).
RESERVED_PREFIX = "triton_python_backend_shm_region_"
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class ShmLimits:
    """What clients may register (ServerOptions carries them; 0 = no limit for the counts)."""

    max_regions: int = 256  # --client-shm-max-regions, server-wide; also at most a quarter of RLIMIT_NOFILE
    max_regions_per_key: int = 64  # --client-shm-max-regions-per-key, with --api-keys
    key_prefixes: tuple[str, ...] = ()  # --client-shm-prefix: keys registered whoever owns the object


DEFAULT_LIMITS = ShmLimits()
FD_SHARE = 4  # regions may hold at most 1/FD_SHARE of the process's open-file limit


def disabled() -> EngineError:
    """Client shared memory is off: HTTP 400 naming the flag, gRPC FAILED_PRECONDITION (a method that exists,
    refused by configuration: frontend/grpc/handlers.py STATUS)."""
    return EngineError(ErrorCode.NOT_ENABLED, DISABLED_MESSAGE)


def _uint(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise invalid(f"shared memory register request: '{what}' must be an unsigned integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise invalid(f"shared memory register request: '{what}' must be an unsigned integer, got {value}")
    return value


class ClientRegion:
    """One registered region: `byte_size` bytes at `offset` of the client's object `key`, held open by fd.

    Created by `SystemSharedMemory.register`; the registry and every in-flight request that uses it hold it,
    and the fd is closed when the last of them lets go (`__del__`). Offsets given to `read_into` and `write`
    are relative to the region (the client's `offset` added here). `owner_uid`: the user who must own the
    object (None: any, the key's prefix being allowed)."""

    __slots__ = ("_fd", "_identity", "_path", "byte_size", "key", "name", "offset")

    def __init__(self, name: str, key: str, offset: int, byte_size: int,
                 owner_uid: int | None = None) -> None:
        self._fd = -1  # set first: __del__ runs even when __init__ raises
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._path = os.path.join(SHM_ROOT, check_key(key))
        try:
            fd = os.open(self._path, _OPEN_FLAGS)
        except OSError:
            raise EngineError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'") from None
        self._fd = fd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EngineError(ErrorCode.INTERNAL, f"Invalid shared memory region: '{key}'")
        if owner_uid is not None and st.st_uid != owner_uid:
            raise invalid(f"failed to register shared memory region '{name}': the object '{key}' belongs to "
                          "another user; the server opens only objects of the client's own user (or keys "
                          "under --client-shm-prefix)")
        if offset + byte_size > st.st_size:
            raise invalid(f"failed to register shared memory region '{name}': invalid args")
        self._identity = (st.st_dev, st.st_ino)

    def __del__(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def _check_alive(self, end: int) -> None:
        """Raise a clean error if the object was removed, replaced or truncated since it was registered:
        `end` is the region-relative end of the range about to be accessed."""
        try:
            st = os.stat(self._path, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._identity:
            raise invalid(f"shared memory region '{self.name}' is gone: its key '{self.key}' was removed "
                          f"(shm_unlink) or now names another object; unregister it and register again")
        if self.offset + end > st.st_size:
            self._truncated(st.st_size)

    def _truncated(self, size: int) -> None:
        raise invalid(f"shared memory region '{self.name}' was truncated by its owner (the object has "
                      f"{size} bytes now; the region was registered with offset {self.offset} and byte_size "
                      f"{self.byte_size}); restore its size, or unregister it and register again")

    def read_into(self, offset: int, target: Any) -> None:
        """Fill the writable buffer `target` (a numpy array, a bytearray) from `offset` of the region, with
        one pread: never a fault, whatever the client did to its object."""
        view = memoryview(target).cast("B")
        nbytes = view.nbytes
        self._check_alive(offset + nbytes)
        done = 0
        while done < nbytes:
            n = os.preadv(self._fd, [view[done:]], self.offset + offset + done)
            if n <= 0:  # truncated between the check and the read
                self._truncated(os.fstat(self._fd).st_size)
            done += n

    def write(self, offset: int, data: Any) -> None:
        """Write the buffer `data` at `offset` of the region with pwrite (never a fault; a write racing a
        truncation can only grow the client's object again, which harms nobody but that client)."""
        view = memoryview(data).cast("B")
        nbytes = view.nbytes
        self._check_alive(offset + nbytes)
        done = 0
        while done < nbytes:
            done += os.pwrite(self._fd, view[done:], self.offset + offset + done)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class PlacedRegion(Protocol):
    """What a request's tensors read and write: a ClientRegion, or a CUDA region (cuda.py `CudaRegion`)."""

    name: str
    byte_size: int

    def read_into(self, offset: int, target: Any) -> None: ...

    def write(self, offset: int, data: Any) -> None: ...


@dataclass(slots=True)
class TensorPlace:
    """Where one tensor's bytes are: `byte_size` bytes at `offset` of `region`."""

    region: PlacedRegion
    offset: int
    byte_size: int


def region_status(owned: Mapping[str, Any], name: str, kind: str, other: str,
                  other_holds: Callable[[], bool]) -> list[dict[str, Any]]:
    """One owner's regions of `kind` (one, by name) in Triton's status form; a name the `other` kind holds
    says so, as Triton's one map of both kinds does."""
    if not name:
        return [r.status() for r in owned.values()]
    region = owned.get(name)
    if region is None:
        if other_holds():
            raise not_found(f"The region named '{name}' is registered as {other} shared memory, not {kind} "
                            "shared memory")
        raise not_found(f"Unable to find {kind.lower()} shared memory region: '{name}'")
    return [region.status()]


class SystemSharedMemory:
    """The registry: owner → region name → ClientRegion. One per server (the DataPlane's), on its event
    loop. Every call names its caller (engine/access/caller.py); NOBODY is the keyless owner."""

    def __init__(self, allowed: bool, limits: ShmLimits = DEFAULT_LIMITS) -> None:
        self.allowed = allowed
        self.limits = limits
        self._prefixes = tuple(p.lstrip("/") for p in limits.key_prefixes)
        self._regions: dict[str, dict[str, ClientRegion]] = {}
        self._count = 0  # regions registered, every owner's
        # Whether an owner holds a CUDA region of a name (set by cuda.py's registry): a name is one region's,
        # of either kind, as in Triton's one map.
        self.cuda_holds: Callable[[str, str], bool] = lambda name, owner: False

    def require_allowed(self) -> None:
        """Raise the refusal naming the flag unless the server was started with --allow-client-shm."""
        if not self.allowed:
            raise disabled()

    def register(self, name: str, key: str, offset: Any, byte_size: Any, caller: Caller = NOBODY) -> None:
        """Register `caller`'s region `name`: `byte_size` bytes at `offset` of the object `key`, opened only
        if the caller may (see the module docstring) and while the counts allow."""
        self.require_allowed()
        if not isinstance(name, str) or not name:
            raise invalid("'region name' is necessary to register system shared memory region")
        if not isinstance(key, str):
            raise invalid("Shared memory register request has no 'key' field")
        offset = _uint(offset, "offset")
        byte_size = _uint(byte_size, "byte_size")
        stripped = key.lstrip("/")
        if not stripped:
            raise invalid(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
        if stripped.startswith(RESERVED_PREFIX):
            raise invalid(f"cannot register shared memory region '{name}' with key '{key}' as the key "
                          f"contains the reserved prefix '{RESERVED_PREFIX}'")
        owned = self._regions.get(caller.owner, {})
        if name in owned or self.cuda_holds(name, caller.owner):
            raise EngineError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        self._check_room(name, caller.owner, len(owned))
        owner_uid = None
        if not (self._prefixes and stripped.startswith(self._prefixes)):
            owner_uid = client_uid(caller.peer, caller.local)
            if owner_uid is None:
                raise invalid(f"failed to register shared memory region '{name}': the server cannot tell "
                              "which user this client runs as (its connection does not come from this "
                              "machine), so it opens no object for it; the operator may allow keys under "
                              "--client-shm-prefix")
        region = ClientRegion(name, key, offset, byte_size, owner_uid)
        self._regions.setdefault(caller.owner, {})[name] = region
        self._count += 1

    def _check_room(self, name: str, owner: str, held: int) -> None:
        """RESOURCE_EXHAUSTED when one more region would pass the server's or the key's count."""
        limits = self.limits
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)  # read now: it may be lowered while serving
        cap = limits.max_regions
        by_fds = soft != resource.RLIM_INFINITY and (not cap or soft // FD_SHARE < cap)
        if by_fds:
            cap = soft // FD_SHARE
        if cap and self._count >= cap:
            why = (f"a quarter of its open-file limit of {soft}" if by_fds else "--client-shm-max-regions")
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"failed to register shared memory region '{name}': the server holds "
                              f"{self._count} regions, the most it may ({why}); unregister some first")
        if owner and limits.max_regions_per_key and held >= limits.max_regions_per_key:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"failed to register shared memory region '{name}': this API key holds {held} "
                              "regions, the most it may (--client-shm-max-regions-per-key); unregister some "
                              "first")

    def unregister(self, name: str = "", caller: Caller = NOBODY) -> None:
        """One of `caller`'s regions, or every one of them when `name` is empty. An unknown name is no error
        (Triton's)."""
        self.require_allowed()
        owned = self._regions.get(caller.owner)
        if not owned:
            return
        if name:
            if owned.pop(name, None) is not None:
                self._count -= 1
        else:
            self._count -= len(owned)
            owned.clear()
        if not owned:
            del self._regions[caller.owner]

    def holds(self, name: str, owner: str) -> bool:
        """Whether `owner` has a system region `name` (a CUDA region may not take its name: cuda.py)."""
        return name in self._regions.get(owner, {})

    def status(self, name: str = "", caller: Caller = NOBODY) -> list[dict[str, Any]]:
        """`caller`'s regions (one, by name), in Triton's status form."""
        return region_status(self._regions.get(caller.owner, {}), name, "system", "CUDA",
                             lambda: self.cuda_holds(name, caller.owner))

    def place(self, name: Any, offset: Any, byte_size: Any, owner: str = "") -> TensorPlace:
        """A tensor's place from a request's parameters, checked against `owner`'s region (Triton's
        GetMemoryInfo): unknown region NOT_FOUND; offset or offset + byte size outside it INVALID_ARG."""
        self.require_allowed()
        if not isinstance(name, str):
            raise invalid("Unable to parse 'shared_memory_region'")
        for value, what in ((offset, "shared_memory_offset"), (byte_size, "shared_memory_byte_size")):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise invalid(f"Unable to parse '{what}'")
        offset, byte_size = int(offset), int(byte_size)
        region = self._regions.get(owner, {}).get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size:
            raise invalid(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return TensorPlace(region, offset, byte_size)

