"""drafting: who proposes the next tokens — forced tokens from the guide, prompt lookup, an assistant model —
and what both the drafters and the loop above use: KV-cache helpers (`kv_cache`), warpers (`sampling`) and the
cursor over a guide (`base.Cursor`)."""

from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, Draft, DraftSource
from drafting.combined import CombinedSource
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup

__all__ = ["AssistantDrafter", "CombinedSource", "Cursor", "Draft", "DraftSource", "ForcedTokens", "PromptLookup"]
