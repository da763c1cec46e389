"""The model repository: which folders are models, which of their versions serve, and how they change.

    lifecycle.py    `ModelRepository`: load, reload (new versions READY beside the old before routing moves),
                    unload, and the repository API's load with sent files or a config override
    kinds.py        the kind registry: which kind of version a model's config is, and how it loads and builds
    routing.py      `RoutingTable`: which loaded version a request goes to, readiness, the index
    fingerprint.py  what a model folder looked like, to tell whether (and which versions of) it changed
    watcher.py      poll mode: file-system events and a rescan, a folder reconciled once it has settled
    overrides.py    model files sent with a load request, written to a private folder outside the repository
    load_errors.py  how a load failure reads to clients: the error's words, never the server's paths
"""
