"""A container made of the host's own files, for starting an image's ENTRYPOINT as its USER where no image can
be built (no Docker engine, no base image to pull). test_image_entrypoint.py runs it as a script, as root:

    unshare --mount --net --fork --kill-child python image_sandbox.py run SPEC_JSON
        In the new mount and network namespaces: bring the loopback up, build a root (a tmpfs) holding the
        host's /usr and /etc read-only, the interpreter, the venv and the checkout at their own paths (left
        writable as mounts, so only their ownership keeps the user out, as in the image where pip installed
        them as root), /proc, /dev, the model repository read-only at /models and a fresh /tmp (the emptyDir;
        read-only if asked); remount that root read-only (readOnlyRootFilesystem), chroot into it and exec
        the command as uid:gid with no supplementary groups and no_new_privs, in exactly the given
        environment.
    nsenter --net=/proc/PID/ns/net python image_sandbox.py client PORT PID
        In the server's network namespace: wait until /v2/health/ready answers 200 on PORT (while PID lives),
        then infer the example `simple` over HTTP; prints one JSON line, {"ready": status, "output": [...]}.

Both halves are the real tools: util-linux's mount and setpriv, the kernel's namespaces and chroot,
tritonclient against the real server.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request

SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def _loopback_up() -> None:
    """`ip link set lo up` without iproute2 (a fresh CI machine may lack it): one ioctl."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP))


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _bind(source: str, target: str, read_only: bool) -> None:
    os.makedirs(target, exist_ok=True)
    _mount("--rbind", *(["-o", "ro"] if read_only else []), source, target)


def run(spec: dict) -> None:
    root = spec["root"]
    _loopback_up()
    _mount("--make-rprivate", "/")
    _mount("-t", "tmpfs", "-o", "mode=755", "imageroot", root)
    for name in ("bin", "lib", "lib64", "sbin"):  # merged-/usr symlinks as they are on the host
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), f"{root}/{name}")
        elif os.path.isdir(f"/{name}"):
            _bind(f"/{name}", f"{root}/{name}", read_only=True)
    for path in ("/usr", "/etc"):
        _bind(path, root + path, read_only=True)
    # /tmp first: a checkout or venv that lives under the host's /tmp (a CI clone, say) is bound inside it,
    # not hidden under it; a read-only /tmp is made so once they are in place
    os.makedirs(f"{root}/tmp")
    _mount("-t", "tmpfs", "-o", "mode=1777", "imagetmp", f"{root}/tmp")
    for path in spec["packages"]:  # the interpreter, the venv, the checkout: root's files, mounted writable
        _bind(path, root + path, read_only=False)
    for source, target in spec.get("extra_binds", []):
        _bind(source, root + target, read_only=False)
    _bind("/proc", f"{root}/proc", read_only=False)
    _bind("/dev", f"{root}/dev", read_only=False)
    _bind(spec["models"], f"{root}/models", read_only=True)
    if spec["tmp_read_only"]:
        _mount("-o", "remount,ro", f"{root}/tmp")
    os.makedirs(root + spec["workdir"], exist_ok=True)  # WORKDIR: made by the build, empty here
    _mount("-o", "remount,ro", root)
    os.chroot(root)
    os.chdir(spec["workdir"])
    os.execve("/usr/bin/setpriv", ["setpriv", "--reuid", str(spec["uid"]), "--regid", str(spec["gid"]),
                                   "--clear-groups", "--no-new-privs", "--", *spec["argv"]], spec["env"])


def client(port: int, pid: int) -> None:
    import numpy as np
    import tritonclient.http as httpclient

    deadline = time.monotonic() + 60
    status = 0
    while status != 200:
        if not os.path.exists(f"/proc/{pid}") or time.monotonic() > deadline:
            print(json.dumps({"ready": status, "output": None}))
            return
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                status = r.status
        except OSError:
            time.sleep(0.1)  # a poll with a deadline, not a wait standing in for one
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with httpclient.InferenceServerClient(f"127.0.0.1:{port}") as c:
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        output = c.infer("simple", inputs).as_numpy("OUTPUT0").tolist()
    print(json.dumps({"ready": status, "output": output}))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(json.loads(sys.argv[2]))
    else:
        client(int(sys.argv[2]), int(sys.argv[3]))
