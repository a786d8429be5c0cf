"""Readers of keyword values that several schema builders share: each checks its value and names the keyword."""

from __future__ import annotations

from fsm.errors import SchemaError


def natural(schema: dict, keyword: str, pointer: str, default):
    value = schema.get(keyword, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"must be a non-negative integer, not {value!r}", keyword=keyword, pointer=pointer)
    return value
