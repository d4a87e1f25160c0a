import pytest
from matrixlite import add, identity, is_symmetric, scale, shape, trace, transpose


def test_shape_of_rectangular_matrix() -> None:
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)


def test_shape_of_empty_matrix() -> None:
    assert shape([]) == (0, 0)


def test_shape_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError):
        shape([[1, 2], [3]])


def test_identity() -> None:
    assert identity(3) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert identity(1) == [[1]]


def test_transpose_rectangular() -> None:
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_row_vector() -> None:
    assert transpose([[7, 8]]) == [[7], [8]]


def test_add_elementwise() -> None:
    assert add([[1, 2], [3, 4]], [[10, 20], [30, 40]]) == [[11, 22], [33, 44]]


def test_add_rejects_shape_mismatch() -> None:
    with pytest.raises(ValueError):
        add([[1, 2]], [[1], [2]])


def test_scale() -> None:
    assert scale([[1, -2], [0, 3]], 2) == [[2, -4], [0, 6]]
    assert scale([[5]], 0) == [[0]]


def test_trace() -> None:
    assert trace([[1, 2], [3, 4]]) == 5
    assert trace([[2, 0, 0], [0, 3, 0], [0, 0, 4]]) == 9


def test_trace_rejects_non_square() -> None:
    with pytest.raises(ValueError):
        trace([[1, 2, 3]])


def test_is_symmetric() -> None:
    assert is_symmetric([[1, 2], [2, 1]]) is True
    assert is_symmetric([[1, 2, 3], [2, 5, 6], [3, 6, 9]]) is True


def test_is_symmetric_rejects_asymmetric_and_non_square() -> None:
    assert is_symmetric([[1, 2, 3], [2, 5, 6], [3, 7, 9]]) is False
    assert is_symmetric([[1, 2]]) is False
