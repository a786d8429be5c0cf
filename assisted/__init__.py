"""assisted: lossless speculative generation with structure-aware drafting.

    from assisted import generate
    out = generate(model, assistant_model, tokenizer=tok, prompt="...", schema=Character)
"""

from assisted.policy.costs import forget as reset_remembered_state
from assisted.generate import generate
from assisted.generate_batch import generate_batch, generate_batch_iter
from assisted.models.draft_vocab import restrict_vocabulary
from assisted.models.int4_models import int4_copy
from assisted.models.packing import pack_linear_weights
from assisted.prefix import PrefixCache
from assisted.processor import GuideLogitsProcessor, logits_processor
from assisted.result import GenerationResult, Seconds, Stats, StepRecord

__all__ = ["generate", "generate_batch", "generate_batch_iter", "logits_processor", "GuideLogitsProcessor",
           "PrefixCache", "reset_remembered_state", "pack_linear_weights", "int4_copy",
           "restrict_vocabulary", "GenerationResult", "Stats",
           "Seconds", "StepRecord"]
