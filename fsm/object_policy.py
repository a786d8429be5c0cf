"""Object policies by name: "compact" (closed, schema order; the default) and "spec" (what validators read)."""

from __future__ import annotations

from fsm.errors import SchemaError

PROPERTY_ORDERS = ("schema", "any")
POLICIES = {  # policy name -> (additional_properties, property_order)
    "compact": (False, "schema"),
    "spec": (True, "any"),
}


def object_policy(
    policy: str | None, additional_properties: bool | None, property_order: str | None
) -> tuple[bool, str]:
    """(additional_properties, property_order) from a policy name and the explicit options that override it."""
    if policy is not None and policy not in POLICIES:
        raise SchemaError(f"policy must be one of {', '.join(map(repr, POLICIES))}, not {policy!r}")
    default_open, default_order = POLICIES[policy or "compact"]
    property_order = default_order if property_order is None else property_order
    if property_order not in PROPERTY_ORDERS:
        raise SchemaError(
            f"property_order must be one of {', '.join(map(repr, PROPERTY_ORDERS))}, not {property_order!r}"
        )
    return (default_open if additional_properties is None else bool(additional_properties)), property_order
