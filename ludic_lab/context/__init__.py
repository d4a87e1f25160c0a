"""Context strategies: what an agent remembers and what the model is shown."""

from ludic_lab.context.base import ContextStrategy
from ludic_lab.context.full_dialog import FullDialog
from ludic_lab.context.truncated_thinking import TruncatedThinkingContext, truncate_thinking

__all__ = ["ContextStrategy", "FullDialog", "TruncatedThinkingContext", "truncate_thinking"]
