"""Numbers written for people."""

from numfmt.roman import from_roman, is_roman, to_roman
from numfmt.text import group_thousands, human_bytes, number_to_words, ordinal

__all__ = ["from_roman", "group_thousands", "human_bytes", "is_roman", "number_to_words", "ordinal", "to_roman"]
