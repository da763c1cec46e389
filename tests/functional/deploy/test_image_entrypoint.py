"""The images' ENTRYPOINT, ENV and USER start a serving server under the restricted Pod Security Standard's
conditions, checked without building an image: the machines here and in CI have a Docker client but no engine
(`docker info`: "Cannot connect to the Docker daemon"), and no base image can be pulled.

Each Dockerfile is read (test_image.py's reader): its ENTRYPOINT is run, `hubserve` being the venv's, in a
sandbox made of the host's files (image_sandbox.py): private mount and network namespaces, a read-only root
(the manifests' readOnlyRootFilesystem) holding the interpreter, the venv and this checkout at their paths,
owned by root as pip leaves them in the image, the model repository read-only at the literal /models, a fresh
tmpfs at /tmp (the emptyDir). The process runs as the Dockerfile's numeric uid:gid (setpriv: no
supplementary groups, no_new_privs) with exactly the Dockerfile's ENV, plus PATH to find `hubserve` and
PYTHONPATH so the checkout's code is the one served (the image has it in site-packages instead).

Checked: /v2/health/ready answers 200 on the first EXPOSEd port, `simple` infers right, the process's
/proc/PID/status shows the uid and gid everywhere and no groups, and no file owned by the uid exists anywhere
in the sandbox outside /tmp (the package files are the root's: the uid cannot write them, shown). Negative
cases: HOME on a writable folder outside /tmp is caught writing there (ONNX Runtime keeps its telemetry id
under $HOME/.cache); a repository only root may read stops the server (the uid is the one files are opened
as); a USER given by name is refused by the reading (setpriv and the kubelet need numbers).
With /tmp read-only the server still serves: ONNX Runtime's id is all that is written there.

Left to a real image build: the base image's own files (its Python, its /etc/passwd entry for the uid) and
`pip install .` in it (this runs the editable install's code).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, wait_until
from hubserve_models import examples
from test_image import DOCKERFILES, _env, _last

SANDBOX = Path(__file__).with_name("image_sandbox.py")
VENV = Path(sys.prefix).resolve()
INTERPRETER = Path(sys.base_prefix).resolve()
# Not scanned for the user's files: what the kernel shows, and /usr and /etc, mounted read-only. /tmp is
# scanned apart: the one place the image may write.
NOT_SCANNED = {"proc", "dev", "sys", "usr", "etc"}



def _why_no_sandbox() -> str | None:
    """Why the sandbox cannot be made on this machine, or None: it needs root (namespaces, mounts, chroot,
    setpriv to another uid), util-linux's tools, and a kernel or container runtime that lets root make mount
    and network namespaces (an unprivileged container does not)."""
    if os.geteuid() != 0:
        return "not root: the sandbox needs namespaces, mounts, chroot and setpriv to another uid"
    missing = [tool for tool in ("unshare", "nsenter", "setpriv", "mount") if not shutil.which(tool)]
    if missing:
        return f"util-linux's {', '.join(missing)} missing"
    probe = subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no mount and network namespaces here: {probe.stderr.strip()}"
    return None


WHY_NO_SANDBOX = _why_no_sandbox()
needs_sandbox = pytest.mark.skipif(WHY_NO_SANDBOX is not None, reason=str(WHY_NO_SANDBOX))


@dataclass(frozen=True, slots=True)
class Image:
    """What a Dockerfile says about how its container starts."""
    entrypoint: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    http_port: int
    workdir: str


def read_image(dockerfile: Path) -> Image:
    user = _last(dockerfile, "USER")
    uid, _, gid = user.partition(":")
    if not (uid.isdigit() and gid.isdigit()):
        raise ValueError(f"USER {user}: not a numeric uid:gid; the kubelet checks runAsNonRoot only against "
                         "numbers, and this test runs the image as the numbers")
    entrypoint = json.loads(_last(dockerfile, "ENTRYPOINT"))  # the exec form: a JSON array
    ports = [int(p.split("/")[0]) for p in _last(dockerfile, "EXPOSE").split()]
    return Image(entrypoint, _env(dockerfile), int(uid), int(gid), ports[0], _last(dockerfile, "WORKDIR"))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    (root / "simple").mkdir()
    shutil.copy(EXAMPLES / "simple" / "config.pbtxt", root / "simple" / "config.pbtxt")
    examples.build_repository(root, ["simple"])
    # Readable by every uid, writable by root alone, as a volume of root's files (pytest's are 700).
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def _packages() -> list[str]:
    """The interpreter, the venv and the checkout, each mounted once (one inside another rides along)."""
    paths = sorted({str(INTERPRETER), str(VENV), str(ROOT)}, key=len)
    kept: list[str] = []
    for path in paths:
        if not path.startswith("/usr/") and not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


class Sandbox:
    """One image run: started by the constructor, stopped by stop() or waited for by wait()."""

    def __init__(self, image: Image, models: Path, workspace: Path, argv: list[str] | None = None,
                 tmp_read_only: bool = False, extra_binds: list[tuple[str, str]] | None = None) -> None:
        (workspace / "root").mkdir()
        program = [str(VENV / "bin" / image.entrypoint[0]), *image.entrypoint[1:]]
        spec = {"root": str(workspace / "root"), "packages": _packages(), "models": str(models),
                "tmp_read_only": tmp_read_only, "extra_binds": extra_binds or [], "uid": image.uid,
                "gid": image.gid, "workdir": image.workdir, "argv": argv or program,
                "env": {"PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                        "PYTHONUNBUFFERED": "1", **image.env}}
        self.log_path = workspace / "server.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "--net", "--fork", "--kill-child", sys.executable, str(SANDBOX), "run",
                 json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT)

    @functools.cached_property
    def pid(self) -> int:
        """The entrypoint's process: unshare's one child (the launcher, which execs chroot's setpriv's
        program); asked for while the sandbox runs."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")

        def child() -> str:
            if self.process.poll() is not None:
                raise AssertionError(f"the sandbox exited with {self.process.returncode}:\n{self.log()}")
            return children.read_text().strip()

        return int(wait_until(child, "the sandbox's process started").split()[0])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float = 30) -> int:
        return self.process.wait(timeout_s)

    def client(self, port: int) -> dict:
        """The readiness status and `simple`'s output, asked from inside the sandbox's network namespace."""
        result = subprocess.run(["nsenter", f"--net=/proc/{self.pid}/ns/net", sys.executable, str(SANDBOX),
                                 "client", str(port), str(self.pid)],
                                capture_output=True, text=True, timeout=120, check=True)
        return dict(json.loads(result.stdout.splitlines()[-1]))

    def status(self) -> dict[str, str]:
        lines = Path(f"/proc/{self.pid}/status").read_text().splitlines()
        return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}

    def written(self, uid: int) -> tuple[list[str], list[str]]:
        """Files and folders owned by `uid` in the sandbox, outside /tmp and in /tmp, seen through the
        process's root while it runs (the sandbox's mounts go with its namespace)."""
        root = Path(f"/proc/{self.pid}/root")
        outside: list[str] = []
        inside: list[str] = []
        for top in root.iterdir():
            if top.name in NOT_SCANNED:
                continue
            for folder, dirs, files in os.walk(top):
                for name in dirs + files:
                    path = Path(folder) / name
                    if os.lstat(path).st_uid == uid:
                        (inside if top.name == "tmp" else outside).append("/" + str(path.relative_to(root)))
        return outside, inside

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, 15)
            self.process.wait(30)


@needs_sandbox
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_entrypoint_serves_as_the_images_user(dockerfile, models, tmp_path):
    image = read_image(dockerfile)
    assert image.entrypoint[:2] == ["hubserve", "serve"] and "/models" in image.entrypoint
    sandbox = Sandbox(image, models, tmp_path)
    try:
        answer = sandbox.client(image.http_port)
        assert answer == {"ready": 200, "output": [list(range(0, 32, 2))]}, sandbox.log()
        status = sandbox.status()
        assert status["Uid"].split() == [str(image.uid)] * 4
        assert status["Gid"].split() == [str(image.gid)] * 4
        assert status["Groups"] == "" and status["NoNewPrivs"] == "1"
        cmdline = Path(f"/proc/{sandbox.pid}/cmdline").read_bytes().split(b"\0")
        assert [a.decode() for a in cmdline[-4:-1]] == image.entrypoint[1:], cmdline
        outside, inside = sandbox.written(image.uid)
        assert outside == [], f"written outside TMPDIR: {outside}"
        print(f"{dockerfile.name}: written under /tmp: {sorted(inside)}")
    finally:
        sandbox.stop()
    assert sandbox.process.returncode == 0, sandbox.log()


@needs_sandbox
def test_the_images_user_cannot_write_the_package_files(models, tmp_path):
    """The venv, the interpreter and the checkout are mounted writable: only their owner (root) keeps the
    image's user out, as in the image. /tmp, the control, is writable."""
    image = read_image(DOCKERFILES[0])
    probe = f"{VENV}/lib/image-user-probe"
    sandbox = Sandbox(image, models, tmp_path, argv=[
        "/bin/sh", "-c", f"touch /tmp/probe || exit 3; touch {probe}; echo rc=$?"])
    assert sandbox.wait() == 0, sandbox.log()
    assert f"touch: cannot touch '{probe}': Permission denied" in sandbox.log()
    assert "rc=1" in sandbox.log()
    assert not Path(probe).exists()


@needs_sandbox
def test_a_repository_the_user_cannot_read_stops_the_server(models, tmp_path):
    """The uid is the one files are opened as: a volume only root may read (no fsGroup, say) is refused."""
    private = tmp_path / "private"
    shutil.copytree(models, private)
    private.chmod(0o700)
    (tmp_path / "run").mkdir()
    sandbox = Sandbox(read_image(DOCKERFILES[0]), private, tmp_path / "run")
    assert sandbox.wait() != 0
    assert "PermissionError: [Errno 13] Permission denied: '/models/" in sandbox.log(), sandbox.log()


@needs_sandbox
def test_a_home_outside_tmp_is_caught_writing_there(models, tmp_path):
    """The check that nothing is written outside /tmp bites: the image as it would be with a created home
    (`useradd --create-home`, HOME=/home/hubserve) on a writable volume gets ONNX Runtime's files there."""
    image = read_image(DOCKERFILES[0])
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, image.uid, image.gid)
    with_home = Image(image.entrypoint, {**image.env, "HOME": "/home/hubserve"}, image.uid, image.gid,
                      image.http_port, image.workdir)
    (tmp_path / "run").mkdir()
    sandbox = Sandbox(with_home, models, tmp_path / "run", extra_binds=[(str(home), "/home/hubserve")])
    try:
        assert sandbox.client(image.http_port)["ready"] == 200, sandbox.log()
        outside, _ = sandbox.written(image.uid)
    finally:
        sandbox.stop()
    assert "/home/hubserve/.cache" in outside, outside


@needs_sandbox
def test_a_read_only_tmp_still_serves(models, tmp_path):
    """What the server needs /tmp for: nothing to serve an ONNX model. ONNX Runtime's telemetry id (under
    HOME=/tmp) is what the writable run leaves there; read-only, it warns and keeps the id in memory."""
    image = read_image(DOCKERFILES[0])
    sandbox = Sandbox(image, models, tmp_path, tmp_read_only=True)
    try:
        answer = sandbox.client(image.http_port)
        outside, inside = sandbox.written(image.uid)
    finally:
        sandbox.stop()
    assert answer == {"ready": 200, "output": [list(range(0, 32, 2))]}, sandbox.log()
    assert outside == inside == []
    assert sandbox.process.returncode == 0, sandbox.log()


def test_a_user_given_by_name_is_refused(tmp_path):
    named = tmp_path / "Dockerfile"
    named.write_text(DOCKERFILES[0].read_text().replace("USER 10001:10001", "USER hubserve"))
    with pytest.raises(ValueError, match="USER hubserve: not a numeric uid:gid"):
        read_image(named)
    assert read_image(DOCKERFILES[0]).uid == 10001  # the real one reads


def test_the_exposed_ports_are_the_servers_defaults():
    """The entrypoint passes no port: the first EXPOSEd one must be where HTTP listens by default."""
    from engine.cli.parser import build_parser

    args = build_parser().parse_args(read_image(DOCKERFILES[0]).entrypoint[1:])
    for dockerfile in DOCKERFILES:
        ports = [int(p) for p in _last(dockerfile, "EXPOSE").split()]
        assert ports == [args.http_port, args.grpc_port, args.metrics_port]
