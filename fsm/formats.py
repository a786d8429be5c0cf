"""String `format`s: regex text for the content of each supported format, as `rx` terms.

Each regex allows a subset of what the format allows, so every output passes a format checker.
Formats that validators do not know are ignored by them (any string is valid): `format_term`
returns None for those, and the compiler records them as notes.
"""

from __future__ import annotations

from functools import lru_cache

from fsm import rx

_DAY_28 = "(?:0[1-9]|1[0-9]|2[0-8])"
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    f"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-{_DAY_28}|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    f"|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HEX = "[0-9a-fA-F]"
_URI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})"
_H16 = "[0-9a-fA-F]{1,4}"

# Formats produce a subset of what the format allows, so every output passes a format checker.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "email": r"[A-Za-z0-9_+\-]+(?:\.[A-Za-z0-9_+\-]+)*@" + _LABEL + r"(?:\." + _LABEL + ")+",
    "uri": r"[A-Za-z][A-Za-z0-9+\-.]*:" + _URI_CHAR + r"*(?:\?" + _URI_CHAR + r"*)?(?:#" + _URI_CHAR + "*)?",
    "ipv4": _OCTET + r"(?:\." + _OCTET + "){3}",
    "ipv6": f"(?:{_H16}:){{7}}{_H16}|::|(?:{_H16}:){{1,7}}:|:(?::{_H16}){{1,7}}",
    "hostname": _LABEL + r"(?:\." + _LABEL + ")*",
    "duration": r"P(?:[0-9]+W|(?:[0-9]+Y)?(?:[0-9]+M)?[0-9]+D|[0-9]+Y(?:[0-9]+M)?|[0-9]+M)"
    r"|P(?:[0-9]+D)?T[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?",
    "json-pointer": "(?:/(?:[^~/]|~[01])*)*",
}


# Formats a validator (jsonschema's FormatChecker) checks but this module does not build: SchemaError.
CHECKED_ELSEWHERE = frozenset("idn-hostname regex relative-json-pointer uri-template".split())
ALIASES = {"uri-reference": "uri", "iri": "uri", "iri-reference": "uri", "idn-email": "email"}  # a subset of each


@lru_cache(maxsize=None)
def format_term(name: str) -> rx.Rx | None:
    """The content term of format `name` (over characters, no quotes); None when validators ignore it.

    Raises
    ------
    KeyError
        For a format that validators check but that is not supported here.
    """
    from fsm.rx_parse import parse

    name = ALIASES.get(name, name)
    if name in FORMATS:
        return parse(FORMATS[name])
    if name in CHECKED_ELSEWHERE:
        raise KeyError(name)
    return None
