"""The OpenAI API's HTTP side, under /v1 (the API itself, transport aside, is engine/openai/).

    routes.py        `OpenAIRoutes`: /v1/models, /v1/completions, /v1/chat/completions; one task per request
    stream.py        a generation streamed as server-sent events, in OpenAI's chunk format
    batch_routes.py  `BatchRoutes`: the Files and Batch APIs (/v1/files, /v1/batches)
"""
