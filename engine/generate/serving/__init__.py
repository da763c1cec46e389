"""The generation engine served: its thread, its model folders, and what a generation request counts in.

    driver.py         `EngineDriver`: one engine on a thread of its own, driven from the event loop
    registry.py       `GenerationRegistry`: which served models generate, one driver per version
    model_folder.py   a model folder's config parameters → a ready `GenerationEngine`
    chat_template.py  a folder's chat template (which file, none, or ours): chat messages → one prompt
    jinja_template.py a model's own Jinja template, rendered in transformers' sandboxed environment
    prompt.py         `PromptDoor`: both APIs' prompt checks: tokenizing, the context's limits
    latency.py        TTFT and inter-token histograms and token counters, for the metrics
    accounting.py     `RequestAccount`: a generation request's part in its version's Triton statistics
"""
