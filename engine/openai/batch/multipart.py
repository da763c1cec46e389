"""A `multipart/form-data` body (RFC 7578) split into its fields: what `POST /v1/files` receives from the
`openai` package (fields `purpose` and `file`). The whole body is in memory already (the HTTP frontend bounds
it); each field's data is a view into it, never a copy, so an upload costs its body once. At most MAX_PARTS
parts (a form with thousands of empty parts is work for nothing) and MAX_HEAD_BYTES of headers per part.

Pure and bounded, but linear in the body: the routes run it on a worker thread, off the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import bad_request

MAX_PARTS = 16           # the openai package sends 2 (purpose, file), 4 with expires_after
MAX_HEAD_BYTES = 16 << 10  # one part's headers

_BOUNDARY = re.compile(rb'boundary="?([^";]{1,200})"?', re.IGNORECASE)
_PARAM = re.compile(rb';\s*([A-Za-z*]+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class FormField:
    name: str
    filename: str | None  # set for a file field
    data: memoryview      # a view into the body


def parse_form(content_type: bytes, body: bytes | bytearray) -> dict[str, FormField]:
    """The body's fields by name (the first of a repeated name). OpenAIError 400 for a body that is not
    multipart/form-data, or has more than MAX_PARTS parts."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        raise bad_request("Uploads must be sent as multipart/form-data (fields 'purpose' and 'file').")
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise bad_request("The multipart/form-data Content-Type has no boundary.")
    delimiter = b"--" + match.group(1)
    view = memoryview(body)
    # The parts lie between consecutive delimiters: before the first is a preamble, after the last ("--")
    # an epilogue. Each part's leading and trailing CRLF belong to the delimiters around it.
    starts = []
    at = body.find(delimiter)
    while at >= 0:
        starts.append(at)
        if len(starts) > MAX_PARTS + 1:
            raise bad_request(f"The multipart/form-data body has more than {MAX_PARTS} parts.")
        at = body.find(delimiter, at + len(delimiter))
    if len(starts) < 2:
        raise bad_request("The multipart/form-data body has no parts.")
    fields: dict[str, FormField] = {}
    for begin, end in zip(starts, starts[1:], strict=False):
        begin += len(delimiter)
        if body[begin:begin + 2] == b"\r\n":
            begin += 2
        if end - 2 >= begin and body[end - 2:end] == b"\r\n":
            end -= 2
        blank = body.find(b"\r\n\r\n", begin, end)
        if blank < 0:
            raise bad_request("A multipart/form-data part has no blank line after its headers.")
        if blank - begin > MAX_HEAD_BYTES:
            raise bad_request(f"A multipart/form-data part has more than {MAX_HEAD_BYTES} bytes of headers.")
        head = bytes(view[begin:blank])
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
        fields.setdefault(key, FormField(key, shown, view[blank + 4:end]))
    return fields
