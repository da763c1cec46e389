"""The one parse of an HTTP request's target (engine/frontend/http/path.py), pure: every endpoint in its
Triton group, every spelling that names the same endpoint parsed to the same result, and every ambiguous one
refused. The servers answering these paths, under keys, restrictions and both process layouts, are
test_encoded_paths.py's.
"""

from __future__ import annotations

import pytest

from engine.access.groups import ApiGroup
from engine.frontend.http.path import Endpoint, HttpTarget, classify, model_target, parse_target

G = ApiGroup
E = Endpoint

# (path, endpoint, group, name, version): one per endpoint, with versions where an endpoint takes one.
CANONICAL = [
    ("/v2", E.SERVER_METADATA, G.METADATA, "", ""),
    ("/v2/health/live", E.HEALTH_LIVE, G.HEALTH, "", ""),
    ("/v2/health/ready", E.HEALTH_READY, G.HEALTH, "", ""),
    ("/v2/models/stats", E.MODELS_STATS, G.STATISTICS, "", ""),
    ("/v2/models/m", E.MODEL_METADATA, G.METADATA, "m", ""),
    ("/v2/models/m/versions/3", E.MODEL_METADATA, G.METADATA, "m", "3"),
    ("/v2/models/m/ready", E.MODEL_READY, G.HEALTH, "m", ""),
    ("/v2/models/m/versions/1/ready", E.MODEL_READY, G.HEALTH, "m", "1"),
    ("/v2/models/m/config", E.MODEL_CONFIG, G.MODEL_CONFIG, "m", ""),
    ("/v2/models/m/stats", E.MODEL_STATS, G.STATISTICS, "m", ""),
    ("/v2/models/m/infer", E.MODEL_INFER, G.INFERENCE, "m", ""),
    ("/v2/models/m/versions/2/infer", E.MODEL_INFER, G.INFERENCE, "m", "2"),
    ("/v2/models/m/generate", E.MODEL_GENERATE, G.INFERENCE, "m", ""),
    ("/v2/models/m/generate_stream", E.MODEL_GENERATE_STREAM, G.INFERENCE, "m", ""),
    ("/v2/models/m/trace/setting", E.MODEL_TRACE, G.TRACE, "m", ""),
    ("/v2/models/m/versions/1/trace/setting", E.MODEL_TRACE, G.TRACE, "m", "1"),
    ("/v2/trace/setting", E.TRACE, G.TRACE, "", ""),
    ("/v2/logging", E.LOGGING, G.LOGGING, "", ""),
    ("/v2/repository/index", E.REPOSITORY_INDEX, G.MODEL_REPOSITORY, "", ""),
    ("/v2/repository/models/m/load", E.REPOSITORY_LOAD, G.MODEL_REPOSITORY, "m", ""),
    ("/v2/repository/models/m/unload", E.REPOSITORY_UNLOAD, G.MODEL_REPOSITORY, "m", ""),
    ("/v2/systemsharedmemory/status", E.SYSTEM_SHM, G.SHARED_MEMORY, "", ""),
    ("/v2/systemsharedmemory/region/r/register", E.SYSTEM_SHM, G.SHARED_MEMORY, "r", ""),
    ("/v2/cudasharedmemory/unregister", E.CUDA_SHM, G.SHARED_MEMORY, "", ""),
    ("/v2/cudasharedmemory/region/r/status", E.CUDA_SHM, G.SHARED_MEMORY, "r", ""),
    ("/v1/chat/completions", E.OPENAI_CHAT_COMPLETIONS, G.INFERENCE, "", ""),
    ("/v1/models", E.OPENAI_MODELS, G.INFERENCE, "", ""),
    ("/v1/embeddings", E.OPENAI_EMBEDDINGS, G.INFERENCE, "", ""),
    ("/v1/batches/b/cancel", E.OPENAI_BATCH_CANCEL, G.INFERENCE, "b", ""),
]
IDS = [c[0] for c in CANONICAL]


def encode_char(c: str, upper: bool = True) -> str:
    return "".join(f"%{b:02X}" if upper else f"%{b:02x}" for b in c.encode())


def same_spellings(path: str) -> list[str]:
    """Spellings of `path` that name exactly what it names: each segment with a letter percent-encoded
    (upper- and lower-case hex), every character encoded, mixed case, a trailing '/', a query string."""
    segments = path.strip("/").split("/")
    out = []
    for i, segment in enumerate(segments):
        for upper in (True, False):
            changed = list(segments)
            changed[i] = encode_char(segment[0], upper) + segment[1:]
            out.append("/" + "/".join(changed))
        changed = list(segments)
        changed[i] = segment[:-1] + encode_char(segment[-1], False)
        out.append("/" + "/".join(changed))
    everything = "/" + "/".join("".join(encode_char(c, i % 2 == 0) for i, c in enumerate(s))
                                for s in segments)
    out += [everything, path + "/", path + "?x=1&y=%2F", path + "/?a", path + "?"]
    return out


@pytest.mark.parametrize("path, endpoint, group, name, version", CANONICAL, ids=IDS)
def test_every_endpoint_is_in_its_tritons_group(path: str, endpoint: Endpoint, group: ApiGroup, name: str,
                                                 version: str) -> None:
    target = parse_target(path.encode())
    assert (target.endpoint, target.group, target.name, target.version) == (endpoint, group, name, version)
    assert target.endpoint.group is group  # the group is the endpoint's: routing and checking cannot differ


@pytest.mark.parametrize("path, endpoint, group, name, version", CANONICAL, ids=IDS)
def test_every_encoding_of_a_path_parses_to_the_same_target(path: str, endpoint: Endpoint, group: ApiGroup,
                                                            name: str, version: str) -> None:
    canonical = parse_target(path.encode())
    for spelling in same_spellings(path):
        target = parse_target(spelling.encode())
        read = (target.endpoint, target.group, target.segments, target.name, target.version)
        assert read == (canonical.endpoint, canonical.group, canonical.segments, canonical.name,
                        canonical.version), spelling


AMBIGUOUS = [
    ("/v2/models/a%2Fb/infer", "encoded '/'"),
    ("/v2/models/a%2fb/infer", "encoded '/'"),
    ("/v2%2Frepository/index", "encoded '/'"),
    ("/v2/models/m/./infer", "dot segment '.'"),
    ("/v2/models/m/../m/infer", "dot segment '..'"),
    ("/v2/models/%2e%2e/infer", "dot segment '..'"),
    ("/v2/models/m/%2E/infer", "dot segment '.'"),
    ("/v2/models/.%2e/infer", "dot segment '..'"),
    ("/v2/repository/models/%2E%2E/load", "dot segment '..'"),
    ("/..", "dot segment '..'"),
    ("/v2//models/m/infer", "empty segment"),
    ("//v2/health/live", "empty segment"),
    ("/v2/models/m//", "empty segment"),
    ("/v2/models/m%00/infer", "control character"),
    ("/v2/models/m%0A/infer", "control character"),
    ("/v2/models/m%0d%0aX-Injected:%201/infer", "control character"),
    ("/v2/models/m%7F/infer", "control character"),
    ("/v2/models/m%C2%85/infer", "control character"),  # NEL, a C1 control
    ("/v2/models/m\x7f/infer", "control character"),
    ("/v2/models/m%/infer", "invalid percent-encoding"),
    ("/v2/models/m%4/infer", "invalid percent-encoding"),
    ("/v2/models/m%G0/infer", "invalid percent-encoding"),
    ("/v2/models/m%+1/infer", "invalid percent-encoding"),
    ("/v2/models/m% 1/infer", "invalid percent-encoding"),
    ("/v2/models/%ff/infer", "not valid UTF-8"),
    ("/v2/models/%C3/infer", "not valid UTF-8"),
    ("/v2/models/%ED%A0%80/infer", "not valid UTF-8"),  # an encoded surrogate
    ("/v2/models/%C0%AF/infer", "not valid UTF-8"),  # an overlong '/'
    ("http://host/v2/health/live", "must be a path"),
    ("*", "must be a path"),
    ("/v2/health/live#x", "fragment"),
]


@pytest.mark.parametrize("path, rule", AMBIGUOUS, ids=[a[0] for a in AMBIGUOUS])
def test_an_ambiguous_path_is_refused_with_the_rule_it_breaks(path: str, rule: str) -> None:
    target = parse_target(path.encode("latin-1"))
    assert target.endpoint is Endpoint.MALFORMED and target.group is None
    assert rule in target.problem


def test_raw_utf8_is_read_like_its_percent_encoding() -> None:
    raw = parse_target("/v2/models/modèle/infer".encode())
    encoded = parse_target(b"/v2/models/mod%C3%A8le/infer")
    assert raw == encoded and raw.name == "modèle" and raw.endpoint is Endpoint.MODEL_INFER
    assert parse_target(b"/v2/models/\xe8/infer").endpoint is Endpoint.MALFORMED  # latin-1, not UTF-8


@pytest.mark.parametrize("path, segments, endpoint", [
    # decoded once: '%25' is '%', so this is a model named '%72epository'
    ("/v2/models/%2572epository", ("v2", "models", "%72epository"), E.MODEL_METADATA),
    ("/v2/%2572epository/index", ("v2", "%72epository", "index"), E.NONE),  # decoded once: '%25' is '%'
    ("/v2/models/m/inf%2565r", ("v2", "models", "m", "inf%65r"), E.NONE),
    ("/v2/models/m/infer;x=1", ("v2", "models", "m", "infer;x=1"), E.NONE),  # ';' is a plain character
    ("/v2/models/m%3Bx/infer", ("v2", "models", "m;x", "infer"), E.MODEL_INFER),
    ("/V2/health/live", ("V2", "health", "live"), E.NONE),
    ("/v2/ｒepository/index", ("v2", "ｒepository", "index"), E.NONE),  # a fullwidth letter is not an 'r'
    ("/v2/models/a\\b/infer", ("v2", "models", "a\\b", "infer"), E.MODEL_INFER),
    ("/v2/models/a%5Cb/infer", ("v2", "models", "a\\b", "infer"), E.MODEL_INFER),
])
def test_what_is_not_the_same_endpoint_is_read_one_way_too(path: str, segments: tuple[str, ...],
                                                           endpoint: Endpoint) -> None:
    """Double encoding, ';', case and look-alikes are no trick: decoded once, they are other names."""
    target = parse_target(path.encode())
    assert target.segments == segments
    assert target == classify(segments, target.query)
    assert target.endpoint is endpoint and target.group is endpoint.group


def test_unknown_paths_are_no_endpoint_and_in_no_group() -> None:
    for path in ("/", "/metrics/x", "/healthz", "/v2/nothing", "/v2/health", "/v2/health/alive", "/v2/models",
                 "/v2/models/m/versions", "/v2/models/m/infer/x", "/v2/repository", "/v2/repository/models/m",
                 "/v2/repository/models/m/delete", "/v2/systemsharedmemory", "/v2/trace",
                 "/v2/systemsharedmemory/region/r", "/v2/logging/x", "/v3/models/m/infer"):
        target = parse_target(path.encode())
        assert target.endpoint is Endpoint.NONE and target.group is None, path
    # vLLM's /metrics is served on the HTTP port too, in the statistics group (its keys and restrictions)
    assert parse_target(b"/metrics").endpoint is Endpoint.VLLM_METRICS


def test_a_target_crosses_to_the_engine_as_parsed() -> None:
    """With --workers N the frontend forwards its parse (plain values), never the URL to be read again."""
    for path, *_ in CANONICAL:
        target = parse_target(f"{path}?limit=3".encode())
        wire = target.to_wire()
        assert all(isinstance(v, (str, tuple)) for v in wire)
        assert HttpTarget.from_wire(wire) == target


def test_a_target_built_for_a_name_is_never_encoded_and_read_back() -> None:
    target = model_target(Endpoint.MODEL_METADATA, "a/b c", "2")
    assert (target.name, target.version, target.group) == ("a/b c", "2", G.METADATA)
    assert HttpTarget.from_wire(target.to_wire()) == target


def test_every_endpoint_has_a_group_but_none_and_malformed() -> None:
    for endpoint in Endpoint:
        assert (endpoint.group is None) == (endpoint in (Endpoint.NONE, Endpoint.MALFORMED)), endpoint
