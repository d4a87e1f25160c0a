"""Wrapping and laying out plain text."""

from wraptext.layout import center, indent, justify
from wraptext.wrap import fill, shorten, wrap

__all__ = ["center", "fill", "indent", "justify", "shorten", "wrap"]
