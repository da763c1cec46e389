"""OpenAI's Batch API (docs/generative.md "OpenAI Batch API"): files of requests uploaded (`multipart.py`,
`files.py`), jobs made of them and kept on disk (`jobs.py`, over `store.py`), run through the generation
engine at the scheduler's BATCH priority (`runner.py`, reading each input a line at a time: `input.py`,
`feed.py`), every file and job the key's that made it (`owners.py`), within what one key may hold
(`limits.py`); with `--batch-shared`, one folder for many replicas, each job run by the replica that holds
its lock (`claims.py`; docs/replicas.md); the HTTP side in engine/frontend/openai/batch_routes.py."""
