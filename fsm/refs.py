"""`$ref` -> a JSON pointer from the root ("#/..."), resolved as the spec says (2020-12 core 8.2, 9):
against the base URI of the nearest enclosing `$id`, to an embedded resource, a plain-name anchor
(`$anchor`, or draft 7's `"$id": "#name"`) or a pointer inside that resource.

The dialect decides the spellings: draft-04 names resources with `id`; up to draft-07 an `$id` beside a
`$ref` is ignored like every other sibling (draft-07 core 8.3), so it neither changes the base URI nor
names a resource or an anchor; `$anchor` exists from 2019-09, `"$id": "#name"` up to draft-07 (and, as
before, in schemas without `$schema`). Only subschemas reached through the dialect's subschema keywords
(`Dialect.places`) name resources: an `$id` inside an unknown keyword is data, as in validators.

After `absolute_refs(root)` every resolvable `$ref` is a pointer from the root, so the compiler may copy
and merge subschemas freely without losing their base. Refs that resolve to nothing are left as they
are (the compiler reports them where they are used).
"""

from __future__ import annotations

from urllib.parse import urldefrag, urljoin

from fsm.dialects import DEFAULT, Dialect

DEFAULT_BASE = "https://fsm.invalid/root.json"  # a stand-in for the root's URI when it has no $id
SCHEMA_MAPS = frozenset("properties patternProperties $defs definitions dependentSchemas dependencies".split())
NOT_SCHEMAS = frozenset("enum const default examples required type dependentRequired $comment".split())


def absolute_refs(root, dialect: Dialect = DEFAULT):
    """A copy of `root` whose resolvable `$ref`s are pointers from the root ("#/a/b")."""
    if not isinstance(root, dict) or not _has_ref(root):
        return root
    index = _Index(dialect)
    index.visit(root, _base(DEFAULT_BASE, root, dialect), "#")
    return _rewrite(root, _base(DEFAULT_BASE, root, dialect), index)


def _own_id(node: dict, dialect: Dialect):
    """The node's `$id` (draft-04: `id`), None where the dialect ignores it (beside a `$ref` up to draft-07)."""
    if dialect.legacy and "$ref" in node:
        return None
    sid = node.get(dialect.id_keyword)
    return sid if isinstance(sid, str) else None


def _base(base: str, node: dict, dialect: Dialect) -> str:
    sid = _own_id(node, dialect)
    if sid is not None and not sid.startswith("#"):
        return urldefrag(urljoin(base, sid))[0]
    return base


class _Index:
    """Resources (URI -> pointer) and anchors (URI#name -> pointer) of one schema document."""

    def __init__(self, dialect: Dialect):
        self.dialect = dialect
        self.resources: dict[str, str] = {}
        self.anchors: dict[str, str] = {}

    def visit(self, node, base: str, pointer: str, known: bool = True) -> None:
        """Index `node` (`known`: reached through subschema keywords only, else its ids are plain data)."""
        if not isinstance(node, dict):
            return
        if known:
            base = self._register(node, base, pointer)
        for keyword, child, where in _children(node, pointer):
            self.visit(child, base, where, known and keyword in self.dialect.places)

    def _register(self, node: dict, base: str, pointer: str) -> str:
        """Record the resource and anchor `node` names; its base URI."""
        base = _base(base, node, self.dialect)
        self.resources.setdefault(base, pointer)
        anchor = node.get("$anchor") if self.dialect.dollar_anchors else None
        sid = _own_id(node, self.dialect)
        if self.dialect.id_anchors and sid is not None and sid.startswith("#") and len(sid) > 1:
            anchor = anchor or sid[1:]
        if isinstance(anchor, str):
            self.anchors.setdefault(f"{base}#{anchor}", pointer)
        return base

    def resolve(self, ref: str, base: str) -> str | None:
        uri, fragment = urldefrag(urljoin(base, ref))
        if uri not in self.resources:
            return None
        if fragment == "" or fragment.startswith("/"):
            return self.resources[uri] + fragment
        return self.anchors.get(f"{uri}#{fragment}")


def _children(node: dict, pointer: str):
    for keyword, value in node.items():
        if keyword in NOT_SCHEMAS:
            continue
        where = f"{pointer}/{_escape(keyword)}"
        if keyword in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield keyword, sub, f"{where}/{_escape(name)}"
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                yield keyword, sub, f"{where}/{i}"
        elif isinstance(value, dict):
            yield keyword, value, where


def _rewrite(node, base: str, index: _Index, known: bool = True):
    if not isinstance(node, dict):
        return node
    base = _base(base, node, index.dialect) if known else base
    out = {}
    for keyword, value in node.items():
        inner = known and keyword in index.dialect.places
        if keyword == "$ref" and isinstance(value, str):
            out[keyword] = index.resolve(value, base) or value
        elif keyword in NOT_SCHEMAS:
            out[keyword] = value
        elif keyword in SCHEMA_MAPS and isinstance(value, dict):
            out[keyword] = {name: _rewrite(sub, base, index, inner) for name, sub in value.items()}
        elif isinstance(value, list):
            out[keyword] = [_rewrite(sub, base, index, inner) for sub in value]
        else:
            out[keyword] = _rewrite(value, base, index, inner)
    return out


def _has_ref(node) -> bool:
    """Whether a "$ref" key appears anywhere in `node`."""
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(value) for value in node.values())
    return isinstance(node, list) and any(_has_ref(value) for value in node)


def _escape(name: str) -> str:
    from urllib.parse import quote

    return quote(name.replace("~", "~0").replace("/", "~1"), safe="~!$&'()*+,;=:@")
