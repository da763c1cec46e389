"""OpenAI's Batch API (README "OpenAI Batch API"): files of requests uploaded (`files.py`), jobs made of
them and kept on disk (`jobs.py`), run through the generation engine at the scheduler's BATCH priority
(`runner.py`), the HTTP side in engine/frontend/openai_batch_routes.py."""
