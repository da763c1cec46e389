"""OpenAI's Batch API (docs/generative.md "OpenAI Batch API"): files of requests uploaded (`multipart.py`,
`files.py`), jobs made of them and kept on disk (`jobs.py`), run through the generation engine at the
scheduler's BATCH priority (`runner.py`, reading each input a line at a time: `input.py`, `feed.py`), every
file and job the key's that made it (`owners.py`), within what one key may hold (`limits.py`); the HTTP side
in engine/frontend/openai/batch_routes.py."""
