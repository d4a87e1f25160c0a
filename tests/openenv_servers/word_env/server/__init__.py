"""The word environment's server."""
