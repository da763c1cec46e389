"""Ensembles (`platform: "ensemble"`), pipelines of other models; the config step: engine/config/ensemble.py.

    plan.py     the planner (pure): the steps' DAG, its checks in Triton's words, which steps may run when
    driver.py   `EnsembleModel`: a `Model` whose requests run their steps on the composing models
    loading.py  how the repository loads (composing models first) and unloads ensembles
    kind.py     the ensemble kind: registered with the repository's kind registry (engine/repository/kinds.py)
"""
