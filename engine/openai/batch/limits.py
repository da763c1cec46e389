"""What the Batch API lets a client hold: one frozen object, built from the `--batch-*` flags
(engine/cli/ → ServerOptions → here), read by the file store, the job store and the runner.

"Per key" means per owner (owners.py): a server without `--api-keys` has one owner, so there the per-key
bounds are the server's. Every list a client grows is bounded by one of these: its files (count and bytes),
its jobs (count: past it the oldest finished jobs are forgotten), its jobs running at once, and the jobs
running at once over all keys (a running job holds an open input file and its read-ahead, not its parsed
input: input.py). A job holds them for its completion window at most: past it, it expires (runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_file_bytes: int = 32 << 20  # one uploaded input file (--batch-max-file-mb; OpenAI's: 200 MB)
    max_requests: int = 50_000  # lines of one input file (--batch-max-requests; OpenAI's limit)
    # a key's files, inputs and job outputs together (--batch-max-storage-mb-per-key)
    max_storage_bytes_per_key: int = 1 << 30
    max_files_per_key: int = 1000  # a key's files (--batch-max-files-per-key)
    max_jobs_per_key: int = 1000  # a key's jobs kept; the oldest finished go first (--batch-max-jobs-per-key)
    max_live_jobs_per_key: int = 8  # a key's jobs validating or in progress (--batch-max-live-jobs-per-key)
    max_live_jobs: int = 64  # the same over all keys (--batch-max-live-jobs)
    # how long a job has to finish from its creation (--batch-completion-window-secs; OpenAI's "24h")
    completion_window_secs: int = 24 * 3600
