"""drafting: who proposes the next tokens — forced tokens from the guide, prompt lookup, an assistant model."""

import assisted  # noqa: F401  first: drafting uses assisted's cache and sampling helpers, assisted uses drafting

from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, Draft, DraftSource
from drafting.combined import CombinedSource
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup

__all__ = ["AssistantDrafter", "CombinedSource", "Cursor", "Draft", "DraftSource", "ForcedTokens", "PromptLookup"]
