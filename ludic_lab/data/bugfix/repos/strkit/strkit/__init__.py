"""Small string utilities."""

from strkit.case import camel_to_snake, capitalize_words, snake_to_camel
from strkit.text import common_prefix, count_vowels, is_palindrome, reverse_words, slugify, truncate

__all__ = [
    "camel_to_snake",
    "capitalize_words",
    "common_prefix",
    "count_vowels",
    "is_palindrome",
    "reverse_words",
    "slugify",
    "snake_to_camel",
    "truncate",
]
