"""Triton's JSON form of a model config, for the HTTP config endpoint and the peers' repositories.

protobuf's own JSON mapping prints 64-bit integers as strings; Triton prints them as numbers, and its clients
and perf_analyzer read `max_batch_size`, dims and versions as numbers. Called on a completed config proto
(`ModelConfig.as_json`, perf/peers/repos.py).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

_INT_TYPES = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
              FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def message_to_json(msg: Any) -> dict[str, Any]:
    """Like protobuf's MessageToDict with field names and defaults, but 64-bit integers stay numbers
    (Triton's clients and perf_analyzer read `max_batch_size`, dims and versions as numbers)."""
    out = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _ints_to_numbers(msg, out)
    return out


def _ints_to_numbers(msg: Any, out: dict[str, Any]) -> None:
    for fd in msg.DESCRIPTOR.fields:
        if fd.name not in out:
            continue
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            value_fd = fd.message_type.fields_by_name["value"]
            if value_fd.message_type is not None:
                for key, sub in value.items():
                    _ints_to_numbers(sub, out[fd.name][str(key)])
            elif value_fd.type in _INT_TYPES:
                out[fd.name] = {k: int(v) for k, v in out[fd.name].items()}
            continue
        if fd.message_type is not None:
            if fd.is_repeated:
                for sub_msg, sub_out in zip(value, out[fd.name], strict=True):
                    _ints_to_numbers(sub_msg, sub_out)
            else:
                _ints_to_numbers(value, out[fd.name])
        elif fd.type in _INT_TYPES:
            out[fd.name] = [int(v) for v in out[fd.name]] if fd.is_repeated \
                else int(out[fd.name])
