"""engine/openai/batch/claims.py and store.SharedFolder: a job claimed by one process at a time, the claim
free again when its holder exits or is killed; and the folder read again as other replicas change it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import wait_until
from engine.openai.batch.claims import Claims
from engine.openai.batch.store import SharedFolder, write_json

BATCH = "batch_" + "0" * 32

HOLDER = """
import sys, time
from pathlib import Path
from engine.openai.batch.claims import Claims
claims = Claims(Path(sys.argv[1]), shared=True)
assert claims.try_claim(sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


def hold_in_another_process(root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), BATCH], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_claim_held_by_another_process_is_refused_until_that_process_dies(tmp_path: Path):
    holder = hold_in_another_process(tmp_path)
    try:
        claims = Claims(tmp_path, shared=True)
        assert not claims.try_claim(BATCH) and not claims.holds(BATCH)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert wait_until(lambda: claims.try_claim(BATCH), "the dead holder's lock released", 10)
        assert claims.holds(BATCH)
    finally:
        holder.kill()
        holder.wait(10)


def test_a_released_claim_can_be_taken_by_another(tmp_path: Path):
    mine = Claims(tmp_path, shared=True)
    assert mine.try_claim(BATCH) and mine.try_claim(BATCH)  # holding it: asking again is yes
    mine.release(BATCH)
    holder = hold_in_another_process(tmp_path)  # free again: another process takes it
    try:
        assert not mine.try_claim(BATCH)
    finally:
        holder.kill()
        holder.wait(10)


def test_without_shared_every_claim_succeeds_and_nothing_is_written(tmp_path: Path):
    claims = Claims(tmp_path, shared=False)
    assert claims.try_claim(BATCH) and claims.holds(BATCH)
    assert list(tmp_path.iterdir()) == []


def test_the_shared_folder_sees_documents_written_replaced_and_deleted_by_others(tmp_path: Path):
    folder = SharedFolder(tmp_path, "batch_", ".cancel")
    assert folder.read() == ({}, frozenset())
    write_json(tmp_path / f"{BATCH}.json", {"v": 1})
    (tmp_path / "batch_not-an-id.json").write_text("{}")  # not a name the store makes: never read
    (tmp_path / f"{BATCH}.json.tmp").write_text("{half")  # another replica mid-write: not a document
    assert folder.read() == ({BATCH: {"v": 1}}, frozenset())
    write_json(tmp_path / f"{BATCH}.json", {"v": 2})  # replaced whole, by a rename: a new inode
    (tmp_path / f"{BATCH}.cancel").touch()
    assert folder.read() == ({BATCH: {"v": 2}}, frozenset({BATCH}))
    (tmp_path / f"{BATCH}.json").unlink()
    assert folder.read()[0] == {}
