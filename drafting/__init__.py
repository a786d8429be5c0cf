"""drafting: who proposes the next tokens — forced tokens from the guide, an assistant model, or both."""

from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, Draft, DraftSource
from drafting.combined import CombinedSource
from drafting.forced import ForcedTokens

__all__ = ["AssistantDrafter", "CombinedSource", "Cursor", "Draft", "DraftSource", "ForcedTokens"]
