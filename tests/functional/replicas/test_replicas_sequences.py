"""Sequences on two replicas (docs/replicas.md "Sequences need sticky routing"): a sequence's state lives on
the replica that started it, so another replica answers its next request with the clear 400 it gives any
sequence it never saw, through tritonclient over HTTP and gRPC; a round-robin proxy breaks a sequence that
way; routing on the header of deploy/routing/destinationrule.yaml (the correlation id) keeps every sequence
on one replica, while requests without the header still go to both."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, RunningServer, start_server
from hubserve_harness.proxy import RoundRobinProxy
from hubserve_models import examples
from test_deploy_routing import header_name

MODEL = "sequence_accumulator"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sequences") / "repo"
    for name in (MODEL, "simple"):
        (root / name).mkdir(parents=True)
        shutil.copy(EXAMPLES / name / "config.pbtxt", root / name / "config.pbtxt")
    examples.build_repository(root, [MODEL, "simple"])
    logs = tmp_path_factory.mktemp("sequences_logs")
    running = [start_server(root, logs / f"{name}.log", "--workers", "1") for name in ("a", "b")]
    yield running
    for srv in running:
        srv.stop()


def step(client, sequence_id: int, value: int, start: bool = False, end: bool = False,
         headers: dict[str, str] | None = None) -> int:
    """One request of a sequence of the accumulator: the sum of the sequence's values so far."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(MODEL, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end,
                          headers=headers)
    return int(result.as_numpy("OUTPUT")[0][0])


def clients(srv: RunningServer) -> tuple[httpclient.InferenceServerClient, grpcclient.InferenceServerClient]:
    return httpclient.InferenceServerClient(srv.http_url), grpcclient.InferenceServerClient(srv.grpc_url)


@pytest.mark.parametrize("protocol", [0, 1], ids=["http", "grpc"])
def test_a_replica_that_did_not_start_a_sequence_refuses_its_next_request(replicas: list[RunningServer],
                                                                          protocol: int):
    a, b = clients(replicas[0])[protocol], clients(replicas[1])[protocol]
    sequence_id = 100 + protocol
    assert step(a, sequence_id, 5, start=True) == 5
    with pytest.raises(InferenceServerException) as refused:
        step(b, sequence_id, 2)
    status = "400" if protocol == 0 else "StatusCode.INVALID_ARGUMENT"
    assert refused.value.status() == status
    assert "START" in refused.value.message()
    assert step(a, sequence_id, 2, end=True) == 7  # its own replica still has it


def test_round_robin_breaks_a_sequence(replicas: list[RunningServer]):
    """Why the rule is needed: without it, the second request of a sequence lands on the other replica."""
    with RoundRobinProxy([("127.0.0.1", r.http_port) for r in replicas]) as proxy:
        client = httpclient.InferenceServerClient(proxy.url)
        assert step(client, 200, 1, start=True) == 1
        with pytest.raises(InferenceServerException) as refused:
            step(client, 200, 1)
        assert refused.value.status() == "400" and "START" in refused.value.message()
        assert [index for _, _, index in proxy.routed][:2] in ([0, 1], [1, 0])


def test_routing_on_the_sequence_header_keeps_each_sequence_on_one_replica(replicas: list[RunningServer]):
    header = header_name()  # the shipped rule's (deploy/routing/destinationrule.yaml)
    with RoundRobinProxy([("127.0.0.1", r.http_port) for r in replicas],
                         sticky_header=header) as proxy:
        client = httpclient.InferenceServerClient(proxy.url)
        sequences = list(range(300, 308))
        sums = dict.fromkeys(sequences, 0)
        for i in range(4):  # the sequences' requests interleaved, as concurrent clients send them
            for sequence_id in sequences:
                value = sequence_id + i
                sums[sequence_id] += value
                got = step(client, sequence_id, value, start=i == 0, end=i == 3,
                           headers={header: str(sequence_id)})
                assert got == sums[sequence_id]
        routed = proxy.routed
        by_sequence = [{index for _, _, index in routed[k::len(sequences)]} for k in range(len(sequences))]
        assert all(len(replicas_seen) == 1 for replicas_seen in by_sequence)  # each on one replica
        assert set().union(*by_sequence) == {0, 1}  # and the sequences spread over both
        routed.clear()
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        for _ in range(4):  # a stateless request carries no header: any replica
            inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(x)
            assert client.infer("simple", inputs).as_numpy("OUTPUT0").tolist() == (x + x).tolist()
        assert {index for _, _, index in routed} == {0, 1}

