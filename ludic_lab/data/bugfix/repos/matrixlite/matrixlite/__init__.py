"""Matrices as lists of rows of numbers."""

from matrixlite.core import add, identity, is_symmetric, scale, shape, trace, transpose
from matrixlite.linalg import determinant, matmul, matvec, power

__all__ = [
    "add",
    "determinant",
    "identity",
    "is_symmetric",
    "matmul",
    "matvec",
    "power",
    "scale",
    "shape",
    "trace",
    "transpose",
]
