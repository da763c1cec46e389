"""A model's configuration: read once, completed, checked, then frozen, so no later stage reads the proto.

    steps.py         the steps: parse (config.pbtxt / config.yaml) → auto-complete from the model → validate
    model_config.py  the frozen `ModelConfig` and its parts, what every later stage reads
    sequence.py      the `sequence_batching` section: its frozen types and their validation
    ensemble.py      the step for `platform: "ensemble"` (the steps and their data flow)
    json_form.py     Triton's JSON form of a config, for the config endpoints
"""
