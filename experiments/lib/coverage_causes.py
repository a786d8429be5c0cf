"""Why was a valid instance rejected? A heuristic cause for each false reject of a coverage run.

The runner records where the byte DFA (or the token walk) stopped: a JSON path, and whether it was
inside a key or a value. This module looks at the schema and the instance there and names the likely
cause ("undeclared property", "properties out of schema order", "string format 'uri'", ...), so the
summary can count causes and show the smallest example of each.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

def classify(kind: str, path: str, schema, instance) -> str:
    """A short cause for one false reject (`kind` and `path`, a JSON pointer, as in failures.csv)."""
    if kind == "false_reject_token":
        return "token level: the text matches, the tokenizer's own token path does not"
    if kind == "walk_error":
        return "walk crashed"
    if not path:
        return "text ends too early for the guide (it expects more)"
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:] if p]
    if parts and parts[-1] == "<key>":
        return _key_cause(schema, instance, parts[:-2], parts[-2])
    return _value_cause(schema, instance, parts)


def _key_cause(schema, instance, object_path: list[str], key: str) -> str:
    nodes = subschemas_at(schema, object_path)
    declared = [
        name for node in nodes for name in node.get("properties", {}) if isinstance(node.get("properties"), dict)
    ]
    if key not in declared:
        extras = {
            json.dumps(node.get("additionalProperties", "absent"))[:20] for node in nodes if _is_object_schema(node)
        }
        if not extras or extras == {'"absent"'}:
            return "undeclared property, additionalProperties absent (closed by default)"
        if any(n.get("patternProperties") for n in nodes):
            return "undeclared property matching patternProperties"
        return f"undeclared property, additionalProperties {' / '.join(sorted(extras))}"
    keys = list(_value_at(instance, object_path) or {})
    order = {name: i for i, name in enumerate(dict.fromkeys(declared))}
    ranks = [order[k] for k in keys if k in order]
    if ranks != sorted(ranks):
        return "properties out of schema order"
    return "declared property rejected at its key (e.g. unresolved alternative)"


def _value_cause(schema, instance, path: list[str]) -> str:
    value = _value_at(instance, path)
    nodes = subschemas_at(schema, path)
    keywords = {k for node in nodes for k in node}
    if isinstance(value, str):
        for keyword in ("format", "pattern"):
            if keyword in keywords:
                detail = sorted({str(n[keyword]) for n in nodes if keyword in n})
                return f"string {keyword} {detail[0]!r}" if keyword == "format" else "string pattern"
        if "\\" in json.dumps(value, ensure_ascii=False):
            return "string with escapes"
        return "string value (other)"
    if isinstance(value, bool) or value is None:
        return f"{json.dumps(value)} rejected"
    if isinstance(value, float) and value.is_integer() and any(n.get("type") == "integer" for n in nodes):
        return "integer written with a fraction (1.0)"
    if isinstance(value, (int, float)):
        bounds = keywords & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
        return f"number with {'/'.join(sorted(bounds))}" if bounds else "number (other)"
    if isinstance(value, list):
        return "array (items/length)"
    if isinstance(value, dict):
        return "object (empty, or required/optional structure)"
    return "other"


def _is_object_schema(node: dict) -> bool:
    return "properties" in node or node.get("type") == "object" or "additionalProperties" in node


def _value_at(instance, path: list[str]):
    node = instance
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def subschemas_at(root, path: list[str]) -> list[dict]:
    """Every (sub)schema that may apply at `path` of an instance, through $ref, *Of, properties, items."""
    nodes = _expand(root, root)
    for part in path:
        children = []
        for node in nodes:
            props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            if part in props:
                children.append(props[part])
            elif part.isdigit() and isinstance(node.get("prefixItems", node.get("items")), list):
                items = node.get("prefixItems", node.get("items"))
                children.append(
                    items[int(part)]
                    if int(part) < len(items)
                    else node.get("additionalItems", node.get("items") if "prefixItems" in node else True)
                )
            elif part.isdigit() and isinstance(node.get("items"), dict):
                children.append(node["items"])
            elif isinstance(node.get("additionalProperties"), dict):
                children.append(node["additionalProperties"])
        nodes = [n for child in children for n in _expand(child, root)]
    return nodes


def _expand(node, root, depth: int = 0) -> list[dict]:
    if not isinstance(node, dict) or depth > 12:
        return []
    out = [node]
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out += _expand(_resolve(root, ref), root, depth + 1)
    for keyword in ("allOf", "anyOf", "oneOf"):
        for sub in node.get(keyword, []) if isinstance(node.get(keyword), list) else []:
            out += _expand(sub, root, depth + 1)
    return out


def _resolve(root, ref: str):
    return _value_at(root, [p.replace("~1", "/").replace("~0", "~") for p in filter(None, ref[1:].split("/"))])


def false_reject_causes(failures: list[dict], data: Path) -> list[dict]:
    """Causes of the false rejects, most common first: {cause, count, schemas, example}."""
    groups: dict[str, list] = defaultdict(list)
    records: dict[str, dict] = {}
    for failure in failures:
        if not failure["kind"].startswith("false_reject") and failure["kind"] != "walk_error":
            continue
        path = Path(data) / failure["file"]
        if failure["file"] not in records:
            records[failure["file"]] = json.loads(path.read_text()) if path.exists() else None
        record = records[failure["file"]]
        if record is None:
            cause = "schema file not found"
        else:
            test = record["tests"][int(failure["test"])]
            try:
                cause = classify(failure["kind"], failure.get("path", ""), record["schema"], test["data"])
            except Exception as error:  # a heuristic must never stop the report
                cause = f"unclassified ({type(error).__name__})"
        groups[cause].append(failure)
    out = []
    for cause, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        example = min(items, key=lambda f: len(f["text"]))
        out.append({"cause": cause, "count": len(items), "schemas": len({f["file"] for f in items}),
                    "example": {k: example[k] for k in ("file", "test", "detail", "text")}})
    return out
