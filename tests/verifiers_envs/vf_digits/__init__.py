from vf_digits.taskset import DigitsTaskset

__all__ = ["DigitsTaskset"]
