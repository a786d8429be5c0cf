"""fsm: constraints (JSON Schema, pydantic models, regexes) -> token-level guides.

    schema -> rx term (schema.py) -> lazy byte DFA (regex.py) -> TokenIndex (index.py) -> Guide (guide.py)
"""

from fsm.budget import Budget, GuideBudgetError
from fsm.dialects import DIALECTS, schema_dialect
from fsm.errors import InvalidTokenError, RegexError, SchemaError
from fsm.guide import Guide
from fsm.index import TokenIndex
from fsm.lazy_dfa import LazyDFA
from fsm.regex import compile_regex
from fsm.schema import compile_schema, compile_with_notes
from fsm.vocabulary import Vocabulary, vocabulary_from_tokenizer

__all__ = [
    "Guide",
    "TokenIndex",
    "LazyDFA",
    "Vocabulary",
    "compile_regex",
    "compile_schema",
    "compile_with_notes",
    "schema_dialect",
    "DIALECTS",
    "vocabulary_from_tokenizer",
    "SchemaError",
    "RegexError",
    "InvalidTokenError",
    "Budget",
    "GuideBudgetError",
]
