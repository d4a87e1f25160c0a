import pytest
from matrixlite import determinant, identity, matmul, matvec, power


def test_matmul_square() -> None:
    assert matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]


def test_matmul_rectangular() -> None:
    assert matmul([[1, 2, 3]], [[1], [0], [2]]) == [[7]]
    assert matmul([[1], [2]], [[3, 4]]) == [[3, 4], [6, 8]]


def test_matmul_rejects_mismatch() -> None:
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])


def test_matvec() -> None:
    assert matvec([[1, 2], [3, 4], [5, 6]], [1, -1]) == [-1, -1, -1]


def test_matvec_rejects_wrong_length() -> None:
    with pytest.raises(ValueError):
        matvec([[1, 2]], [1, 2, 3])


def test_power_zero_and_one() -> None:
    m = [[2, 1], [0, 3]]
    assert power(m, 0) == identity(2)
    assert power(m, 1) == m


def test_power_fibonacci() -> None:
    assert power([[1, 1], [1, 0]], 10) == [[89, 55], [55, 34]]


def test_power_odd_exponent() -> None:
    assert power([[2, 0], [0, 3]], 3) == [[8, 0], [0, 27]]


def test_power_rejects_negative() -> None:
    with pytest.raises(ValueError):
        power([[1]], -1)


def test_determinant_small() -> None:
    assert determinant([[7]]) == 7
    assert determinant([[1, 2], [3, 4]]) == -2


def test_determinant_three_by_three() -> None:
    assert determinant([[2, 0, 1], [1, 3, 2], [1, 1, 2]]) == 6
    assert determinant([[6, 1, 1], [4, -2, 5], [2, 8, 7]]) == -306


def test_determinant_rejects_non_square() -> None:
    with pytest.raises(ValueError):
        determinant([[1, 2, 3], [4, 5, 6]])
