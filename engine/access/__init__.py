"""Who may call what, and how much: decided once per request by the access policy, which every frontend
asks as soon as a request's head is in.

    policy.py    `AccessPolicy` (pure, time passed in): restrictions, API keys and their groups, per-key
                 quotas, the server-wide in-flight byte budget; `LoopbackOnly`; `Refusal`s per protocol
    groups.py    Triton's API groups and its restriction flags, parsed as Triton parses them
    api_keys.py  the `--api-keys` file read once into frozen `ApiKey`s, each with its owner id
    quotas.py    the counters the policy holds: token buckets, concurrency, byte budgets
    caller.py    `Caller`: who sent a request (its key's owner id, the connection's ends), read downstream
"""
