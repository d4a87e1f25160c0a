"""Building and reshaping matrices; element-wise operations."""

Matrix = list[list[float]]


def shape(m: Matrix) -> tuple[int, int]:
    """``(rows, columns)``; raises ``ValueError`` when the rows differ in length."""
    rows = len(m)
    cols = len(m[0]) if rows else 0
    for row in m:
        if len(row) != cols:
            raise ValueError("ragged matrix")
    return rows, cols


def identity(n: int) -> Matrix:
    """The ``n`` x ``n`` identity matrix."""
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m: Matrix) -> Matrix:
    """Rows become columns."""
    rows, cols = shape(m)
    return [[m[i][j] for i in range(rows)] for j in range(cols)]


def add(a: Matrix, b: Matrix) -> Matrix:
    """The element-wise sum; the shapes must match."""
    if shape(a) != shape(b):
        raise ValueError("shapes differ")
    return [[x + y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]


def scale(m: Matrix, k: float) -> Matrix:
    """Every element multiplied by ``k``."""
    return [[k * x for x in row] for row in m]


def trace(m: Matrix) -> float:
    """The sum of the diagonal of a square matrix."""
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError("trace of a non-square matrix")
    return sum(m[i][i] for i in range(rows))


def is_symmetric(m: Matrix) -> bool:
    """True for a square matrix equal to its transpose."""
    rows, cols = shape(m)
    if rows != cols:
        return False
    for i in range(rows):
        for j in range(i + 1, cols):
            if m[i][j] != m[j][i]:
                return False
    return True
