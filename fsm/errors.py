"""The errors fsm raises; all are ValueErrors so callers can catch bad input in one place."""


class SchemaError(ValueError):
    """A JSON Schema that is invalid or uses a keyword the regex cannot enforce."""

    def __init__(self, message: str, *, keyword: str | None = None, pointer: str = ""):
        self.keyword = keyword
        self.pointer = pointer
        where = f" at {pointer or '#'}" if pointer is not None else ""
        super().__init__(f"{message} (keyword {keyword!r}{where})" if keyword else message)


class RegexError(ValueError):
    """A regex that is invalid or cannot be compiled into a finite automaton."""


class InvalidTokenError(ValueError):
    """A token that the guide does not allow in its current state."""
