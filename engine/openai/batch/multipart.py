"""A `multipart/form-data` body (RFC 7578) split into its fields: what `POST /v1/files` receives from the
`openai` package (fields `purpose` and `file`). The whole body is in memory already (the HTTP frontend bounds
it); parts are sliced out of it, never parsed as streams."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import bad_request

_BOUNDARY = re.compile(rb'boundary="?([^";]{1,200})"?', re.IGNORECASE)
_PARAM = re.compile(rb';\s*([A-Za-z*]+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class FormField:
    name: str
    filename: str | None  # set for a file field
    data: bytes


def parse_form(content_type: bytes, body: bytes) -> dict[str, FormField]:
    """The body's fields by name (the first of a repeated name). OpenAIError 400 for a body that is not
    multipart/form-data."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        raise bad_request("Uploads must be sent as multipart/form-data (fields 'purpose' and 'file').")
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise bad_request("The multipart/form-data Content-Type has no boundary.")
    delimiter = b"--" + match.group(1)
    fields: dict[str, FormField] = {}
    chunks = bytes(body).split(delimiter)
    if len(chunks) < 3:
        raise bad_request("The multipart/form-data body has no parts.")
    for chunk in chunks[1:-1]:  # before the first delimiter: a preamble; after the last ("--"): an epilogue
        chunk = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n")
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise bad_request("A multipart/form-data part has no blank line after its headers.")
        disposition = next((line for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-disposition:")), None)
        if disposition is None:
            raise bad_request("A multipart/form-data part has no Content-Disposition header.")
        params = {k.lower(): v for k, v in _PARAM.findall(disposition)}
        name = params.get(b"name")
        if name is None:
            raise bad_request("A multipart/form-data part has no field name.")
        key = name.decode("utf-8", "replace")
        filename = params.get(b"filename")
        shown = None if filename is None else filename.decode("utf-8", "replace")
        fields.setdefault(key, FormField(key, shown, data))
    return fields
