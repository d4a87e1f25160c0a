"""The word environment: repeat a word, two attempts, reward 1 for a reply that holds it."""

from .models import WordAction, WordObservation

__all__ = ["WordAction", "WordObservation"]
