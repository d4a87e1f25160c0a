"""Products, powers and determinants."""

from matrixlite.core import Matrix, identity, shape


def matmul(a: Matrix, b: Matrix) -> Matrix:
    """The product ``a @ b``; ``a``'s columns must match ``b``'s rows."""
    n, k = shape(a)
    k2, m = shape(b)
    if k != k2:
        raise ValueError(f"cannot multiply {n}x{k} by {k2}x{m}")
    return [[sum(a[i][t] * b[t][j] for t in range(k)) for j in range(m)] for i in range(n)]


def matvec(a: Matrix, v: list[float]) -> list[float]:
    """The product of ``a`` and the column vector ``v``."""
    rows, cols = shape(a)
    if cols != len(v):
        raise ValueError("vector length does not match")
    return [sum(a[i][j] * v[j] for j in range(cols)) for i in range(rows)]


def power(m: Matrix, p: int) -> Matrix:
    """``m`` multiplied by itself ``p`` times (the identity for ``p == 0``), by squaring."""
    rows, cols = shape(m)
    if rows != cols or p < 0:
        raise ValueError("power needs a square matrix and p >= 0")
    result = identity(rows)
    base = m
    while p > 0:
        if p % 2 == 1:
            result = matmul(result, base)
        base = matmul(base, base)
        p //= 2
    return result


def determinant(m: Matrix) -> float:
    """The determinant of a square matrix, by expansion along the first row."""
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError("determinant of a non-square matrix")
    if rows == 1:
        return m[0][0]
    if rows == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    total = 0.0
    for j in range(cols):
        minor = [row[:j] + row[j + 1 :] for row in m[1:]]
        sign = -1 if j % 2 else 1
        total += sign * m[0][j] * determinant(minor)
    return total
