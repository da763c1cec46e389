"""Triton's Python backend: models written as `<version>/model.py` with `class TritonPythonModel`.

Request path (modules in order): batcher.py (`RequestBatcher`: one answer per request, checked against the
config by answers.py; sequence.py's `PythonSequenceBatcher` for sequence models, one request per batch row,
with control inputs and implicit state) → backend.py (`IsolatedInstance` per instance process,
`InProcessInstance` on the instance thread) → process.py (the engine's side of an instance process: spawn,
handshake, watchdog, exit) → channel.py (frames on the socket, tensors in shared memory through
engine/shm/regions.py) → stub.py (the instance process) → runner.py (loads model.py, calls initialize /
execute / finalize, converts responses) → pb_utils.py (the API the model imports as
`triton_python_backend_utils`). bls.py carries a model's requests to other models back into the engine and
refuses the calls that could never be answered (a deadlock); autocomplete.py runs a model's static
`auto_complete_config`; environment.py picks the interpreter (EXECUTION_ENV_PATH); overrides.py says what a
repository load's config override may not change of a Python model. model.py is a Python model's version
(`PythonModel`, its batcher chosen and its instances wired), and kind.py registers the Python kind with the
repository (engine/repository/kinds.py); neither is imported by an instance process.

Kept light: the instance process imports this package, so nothing here may import protobuf or the server.
"""
