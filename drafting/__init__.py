"""drafting: who proposes the next tokens — forced tokens from the guide, prompt lookup, an assistant model — by
one `Proposal` rule for one row or many, and what both the drafters and the loop above use: KV-cache helpers
(`kv_cache`), warpers (`sampling`) and the cursor over a guide (`base.Cursor`)."""

from drafting.base import Cursor, Draft
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup
from drafting.proposal import Proposal

__all__ = ["Cursor", "Draft", "ForcedTokens", "PromptLookup", "Proposal"]
