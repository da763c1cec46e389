"""TLS on both frontends (`--http-use-ssl*`, `--grpc-use-ssl*`): Triton's own clients with `ssl=True`, ALPN,
mutual TLS, clients that speak plain text to a TLS port, and the start-up errors, against real servers with
one process and with `--workers 2` (where the handshake runs in the frontend process).

Certificates are made by `trustme` into the test's temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start_server
from hubserve_harness.perf_analyzer import DEFAULT_ARGS, PERF_ANALYZER, perf_analyzer_available
from serve_refusals import serve_refusals


class Certs:
    """A CA, a server certificate for the loopback names, a client certificate from the same CA and one
    from a CA the server does not trust, each as PEM files."""

    def __init__(self, folder: Path) -> None:
        ca, other_ca = trustme.CA(), trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("client@example.org")
        stranger = other_ca.issue_cert("stranger@example.org")
        self.folder = folder
        self.ca = self._write("ca.pem", ca.cert_pem.bytes())
        self.server_cert = self._write("server.pem", b"".join(b.bytes() for b in server.cert_chain_pems))
        self.server_key = self._write("server.key", server.private_key_pem.bytes())
        self.client_cert = self._write("client.pem", b"".join(b.bytes() for b in client.cert_chain_pems))
        self.client_key = self._write("client.key", client.private_key_pem.bytes())
        self.stranger_cert = self._write("stranger.pem",
                                         b"".join(b.bytes() for b in stranger.cert_chain_pems))
        self.stranger_key = self._write("stranger.key", stranger.private_key_pem.bytes())
        self.other_key = self._write("other.key", other_ca.issue_cert("x").private_key_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.folder / name
        path.write_bytes(data)
        return str(path)

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if with_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx

    def tls_flags(self, mutual: bool) -> list[str]:
        """Both protocols' flags, in both boolean spellings (`--x` and `--x=true`)."""
        if mutual:
            use = ["--grpc-use-ssl-mutual=true", "--http-use-ssl-mutual"]
            roots = ["--grpc-root-cert", self.ca, "--http-root-cert", self.ca]
        else:
            use = ["--grpc-use-ssl=true", "--http-use-ssl"]
            roots = []
        return [*use, "--grpc-server-cert", self.server_cert, "--grpc-server-key", self.server_key,
                "--http-server-cert", self.server_cert, "--http-server-key", self.server_key, *roots]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


CLIENT_TIMEOUT_SECS = 1.5  # bounds the TLS handshake too (which takes milliseconds), as in test_h2_limits.py


def _serve(repository: Path, certs: Certs, tmp: Path, workers: str, mutual: bool):
    return start_server(repository, tmp / "server.log", *certs.tls_flags(mutual), "--workers", workers,
                        "--model-control-mode", "explicit", "--load-model", "simple",
                        "--client-timeout-secs", str(CLIENT_TIMEOUT_SECS),
                        https=certs.client_context(with_cert=mutual))


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def tls_server(request, repository, certs, tmp_path_factory):
    srv = _serve(repository, certs, tmp_path_factory.mktemp("tls"), request.param, mutual=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=["1", "2"], ids=["workers1", "workers2"])
def mtls_server(request, repository, certs, tmp_path_factory):
    srv = _serve(repository, certs, tmp_path_factory.mktemp("mtls"), request.param, mutual=True)
    yield srv
    srv.stop()


# ------------------------------------------------------------------------------------------------ helpers

def _simple_inputs(module):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs, a + b


def _infer_ok(client, module) -> None:
    inputs, expected = _simple_inputs(module)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)


def _grpc_client(server, certs: Certs, **ssl_args) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=certs.ca, **ssl_args)


def _grpc_infer(server, certs: Certs, **ssl_args) -> None:
    with _grpc_client(server, certs, **ssl_args) as client:
        inputs, expected = _simple_inputs(grpcclient)
        result = client.infer("simple", inputs, client_timeout=20)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)


def _https_infer(server, certs: Certs, **options) -> None:
    with httpclient.InferenceServerClient(server.http_url, ssl=True, network_timeout=20,
                                          ssl_options={"ca_certs": certs.ca, **options}) as client:
        assert client.is_server_ready()
        _infer_ok(client, httpclient)


def _alpn(port: int, ctx: ssl.SSLContext, offered: list[str]) -> str | None:
    ctx.set_alpn_protocols(offered)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.selected_alpn_protocol()


def _plain_http_answer(port: int) -> bytes:
    """What a plain-text HTTP request to `port` gets back before the server closes (b"" if nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
        return got


# ------------------------------------------------------------------------------------------------- TLS

def test_grpc_over_tls_with_tritonclient(tls_server, certs):
    with _grpc_client(tls_server, certs) as client:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_model_metadata("simple").name == "simple"
        inputs, expected = _simple_inputs(grpcclient)
        result = client.infer("simple", inputs, client_timeout=20)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)


def test_https_with_tritonclient(tls_server, certs):
    _https_infer(tls_server, certs)


def test_alpn_h2_on_grpc_and_http11_on_https(tls_server, certs):
    assert _alpn(tls_server.grpc_port, certs.client_context(), ["h2", "http/1.1"]) == "h2"
    assert _alpn(tls_server.http_port, certs.client_context(), ["h2", "http/1.1"]) == "http/1.1"


def test_plain_text_clients_fail_cleanly_and_the_server_keeps_serving(tls_server, certs):
    assert b"HTTP/1.1 200" not in _plain_http_answer(tls_server.http_port)
    with grpcclient.InferenceServerClient(tls_server.grpc_url) as plain, \
            pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=5)
    with pytest.raises((ssl.SSLError, ConnectionError)):  # a client that does not trust our CA
        _alpn(tls_server.grpc_port, ssl.create_default_context(), ["h2"])
    # A client that connects and never starts the handshake does not hold anything up either.
    with socket.create_connection(("127.0.0.1", tls_server.grpc_port), timeout=10):
        _grpc_infer(tls_server, certs)
        _https_infer(tls_server, certs)
    assert tls_server.process.poll() is None
    assert "Traceback" not in tls_server.log()


@pytest.mark.parametrize("port", ["http_port", "grpc_port"])
def test_a_client_that_never_handshakes_is_closed_after_the_client_timeout(tls_server, certs, port):
    with socket.create_connection(("127.0.0.1", getattr(tls_server, port)), timeout=30) as s:
        started = time.monotonic()
        s.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(4096) == b""  # the server closes; the bound is the socket's timeout
        assert CLIENT_TIMEOUT_SECS * 0.8 <= time.monotonic() - started < 30
    _grpc_infer(tls_server, certs)


def _frontend_pids(server) -> list[int]:
    pid = server.process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_a_frontend_restarted_after_its_key_went_bad_says_why_and_the_other_serves_on(
        repository, certs, tmp_path):
    """--workers 2: each frontend reads the files itself (it runs the handshakes). One restarted after the
    key was replaced by garbage exits with a clear line; the other frontend goes on serving."""
    own = Certs(tmp_path)  # files of this server's own, so spoiling them touches no other test
    srv = _serve(repository, own, tmp_path, "2", mutual=False)
    try:
        deadline = time.monotonic() + 60
        while not all(f"frontend {i} serving" in srv.log() for i in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.1)  # both have read the good files (the engine is ready before they are)
        frontends = _frontend_pids(srv)
        assert len(frontends) == 2
        Path(own.server_key).write_bytes(b"not a key")
        os.kill(frontends[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "cannot serve TLS" not in srv.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"frontend 0 cannot serve TLS: --http-server-cert '{own.server_cert}' or --http-server-key " \
               f"'{own.server_key}' is not a PEM certificate and key" in srv.log(), srv.log()
        served = 0
        for _ in range(10):  # connections handed to the slot while it restarts are closed; others served
            with contextlib.suppress(InferenceServerException):
                _grpc_infer(srv, own)
                served += 1
        assert served >= 3 and srv.process.poll() is None
    finally:
        srv.stop()


# ----------------------------------------------------------------------------------------------- mTLS

def test_mutual_tls_accepts_a_client_certificate(mtls_server, certs):
    _grpc_infer(mtls_server, certs, private_key=certs.client_key, certificate_chain=certs.client_cert)
    _https_infer(mtls_server, certs, certfile=certs.client_cert, keyfile=certs.client_key)


def test_mutual_tls_refuses_clients_without_a_trusted_certificate(mtls_server, certs):
    with pytest.raises(InferenceServerException):
        _grpc_infer(mtls_server, certs)
    with pytest.raises(InferenceServerException):
        _grpc_infer(mtls_server, certs, private_key=certs.stranger_key, certificate_chain=certs.stranger_cert)
    with pytest.raises(Exception):  # noqa: B017 - geventhttpclient raises the socket's error as it is
        _https_infer(mtls_server, certs)
    with pytest.raises(Exception):  # noqa: B017
        _https_infer(mtls_server, certs, certfile=certs.stranger_cert, keyfile=certs.stranger_key)
    _grpc_infer(mtls_server, certs, private_key=certs.client_key, certificate_chain=certs.client_cert)
    assert mtls_server.process.poll() is None


# ---------------------------------------------------------------------------------------- perf_analyzer

def _perf_analyzer(*args: str) -> subprocess.CompletedProcess[str]:
    """perf_analyzer once; on exit 2 ("no stable measurement": the shared machine's noise, not the protocol,
    which is 99) once more with a looser stability rule, as test_perf_analyzer.py does."""
    def run(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(PERF_ANALYZER), "-m", "simple", *DEFAULT_ARGS, *args, *more],
                              capture_output=True, text=True, timeout=120)

    result = run()
    if result.returncode == 2:
        result = run("--stability-percentage", "100", "--max-trials", "20")
    return result


@pytest.mark.skipif(not perf_analyzer_available(), reason="perf_analyzer is not installed")
def test_perf_analyzer_over_grpc_tls_and_https(mtls_server, certs):
    grpc_run = _perf_analyzer("-u", mtls_server.grpc_url, "-i", "grpc", "--ssl-grpc-use-ssl", "true",
                              "--ssl-grpc-root-certifications-file", certs.ca,
                              "--ssl-grpc-private-key-file", certs.client_key,
                              "--ssl-grpc-certificate-chain-file", certs.client_cert)
    assert grpc_run.returncode == 0, grpc_run.stdout + grpc_run.stderr
    https_run = _perf_analyzer("-u", f"https://{mtls_server.http_url}", "-i", "http",
                               "--ssl-https-ca-certificates-file", certs.ca,
                               "--ssl-https-client-certificate-file", certs.client_cert,
                               "--ssl-https-private-key-file", certs.client_key)
    assert https_run.returncode == 0, https_run.stdout + https_run.stderr


# ------------------------------------------------------------------------------------- start-up errors

def _starts_fail(tmp: Path, *runs: list[str]) -> list[str]:
    repo = tmp / "repo"
    repo.mkdir(exist_ok=True)
    return serve_refusals(repo, *runs)


def _start_fails(tmp: Path, *flags: str) -> str:
    """`hubserve serve` with `flags` must exit 2 before serving; returns what it printed."""
    return _starts_fail(tmp, list(flags))[0]


def _relative(path: str) -> str:
    return os.path.relpath(path, ROOT)  # so the message is checked to hold no absolute path


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_startup_errors_name_the_flag_and_only_the_path_given(proto, certs, tmp_path):
    cert, key = _relative(certs.server_cert), _relative(certs.server_key)
    p = f"--{proto}"
    cases = [
        ([f"{p}-use-ssl"], f"{p}-use-ssl needs {p}-server-cert and {p}-server-key"),
        ([f"{p}-use-ssl", f"{p}-server-cert", "missing.pem", f"{p}-server-key", key],
         f"{p}-server-cert 'missing.pem' does not exist"),
        ([f"{p}-use-ssl", f"{p}-server-cert", cert, f"{p}-server-key", _relative(str(tmp_path))],
         f"{p}-server-key '{_relative(str(tmp_path))}' is a folder"),
        ([f"{p}-use-ssl", f"{p}-server-cert", cert, f"{p}-server-key", _relative(certs.other_key)],
         f"{p}-server-key '{_relative(certs.other_key)}' does not match the certificate in {p}-server-cert"),
        ([f"{p}-use-ssl", f"{p}-server-cert", _relative(certs.ca), f"{p}-server-key", cert],
         f"{p}-server-cert '{_relative(certs.ca)}' or {p}-server-key '{cert}' is not a PEM certificate"),
        ([f"{p}-use-ssl-mutual", f"{p}-server-cert", cert, f"{p}-server-key", key],
         f"{p}-use-ssl-mutual needs {p}-root-cert"),
        ([f"{p}-use-ssl=true", f"{p}-use-ssl-mutual=1", f"{p}-server-cert", cert, f"{p}-server-key", key,
          f"{p}-root-cert", key], f"{p}-root-cert '{key}' holds no PEM certificate"),
    ]
    outputs = _starts_fail(tmp_path, *[flags for flags, _ in cases])
    for (flags, message), printed in zip(cases, outputs, strict=True):
        assert message in printed, (flags, printed)
        assert "'/" not in printed and " /" not in printed and str(ROOT) not in printed, printed


def test_an_encrypted_key_is_refused_without_a_prompt(certs, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(certs.server_key).read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"pw")))
    printed = _start_fails(tmp_path, "--grpc-use-ssl", "--grpc-server-cert", _relative(certs.server_cert),
                           "--grpc-server-key", _relative(str(encrypted)))
    assert "is encrypted; hubserve needs an unencrypted PEM key" in printed


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_key_is_named(certs, tmp_path):
    key = tmp_path / "locked.key"
    key.write_bytes(Path(certs.server_key).read_bytes())
    key.chmod(0)
    printed = _start_fails(tmp_path, "--http-use-ssl", "--http-server-cert", _relative(certs.server_cert),
                           "--http-server-key", _relative(str(key)))
    assert "cannot be read (permission denied)" in printed
