"""Write ludic_lab/data/code_problems.jsonl (MBPP format) and code_problems_stdio.jsonl (APPS
format): small programming problems written for ludic_lab, easy enough that a 135M model
solves some. Each row carries a reference solution; tests/test_code_exec_env.py checks that
every reference passes in the sandbox. Every 4th MBPP problem is held out (split "test").

    python scripts/make_code_problems.py
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "ludic_lab" / "data"

# (function name, task text, reference code, [(call args as source, expected value), ...])
FUNCTIONS = [
    (
        "add",
        "Write a function add(a, b) that returns the sum of a and b.",
        "def add(a, b):\n    return a + b",
        [("1, 2", 3), ("-4, 4", 0), ("10, 25", 35)],
    ),
    (
        "subtract",
        "Write a function subtract(a, b) that returns a minus b.",
        "def subtract(a, b):\n    return a - b",
        [("5, 3", 2), ("0, 7", -7), ("10, 10", 0)],
    ),
    (
        "multiply",
        "Write a function multiply(a, b) that returns the product of a and b.",
        "def multiply(a, b):\n    return a * b",
        [("3, 4", 12), ("-2, 5", -10), ("0, 9", 0)],
    ),
    (
        "square",
        "Write a function square(x) that returns x squared.",
        "def square(x):\n    return x * x",
        [("3", 9), ("-4", 16), ("0", 0)],
    ),
    (
        "cube",
        "Write a function cube(x) that returns x to the power of 3.",
        "def cube(x):\n    return x ** 3",
        [("2", 8), ("-3", -27), ("1", 1)],
    ),
    (
        "double",
        "Write a function double(x) that returns two times x.",
        "def double(x):\n    return 2 * x",
        [("4", 8), ("-1", -2), ("0", 0)],
    ),
    (
        "is_even",
        "Write a function is_even(n) that returns True if n is even and False otherwise.",
        "def is_even(n):\n    return n % 2 == 0",
        [("4", True), ("7", False), ("0", True)],
    ),
    (
        "is_odd",
        "Write a function is_odd(n) that returns True if n is odd and False otherwise.",
        "def is_odd(n):\n    return n % 2 == 1",
        [("3", True), ("8", False), ("-5", True)],
    ),
    (
        "max_of_two",
        "Write a function max_of_two(a, b) that returns the larger of a and b.",
        "def max_of_two(a, b):\n    return a if a > b else b",
        [("3, 9", 9), ("10, 2", 10), ("-1, -5", -1)],
    ),
    (
        "min_of_two",
        "Write a function min_of_two(a, b) that returns the smaller of a and b.",
        "def min_of_two(a, b):\n    return a if a < b else b",
        [("3, 9", 3), ("10, 2", 2), ("-1, -5", -5)],
    ),
    (
        "absolute",
        "Write a function absolute(x) that returns the absolute value of x.",
        "def absolute(x):\n    return -x if x < 0 else x",
        [("-7", 7), ("3", 3), ("0", 0)],
    ),
    (
        "list_sum",
        "Write a function list_sum(nums) that returns the sum of a list of numbers.",
        "def list_sum(nums):\n    return sum(nums)",
        [("[1, 2, 3]", 6), ("[]", 0), ("[-1, 1, 5]", 5)],
    ),
    (
        "list_max",
        "Write a function list_max(nums) that returns the largest number in a non-empty list.",
        "def list_max(nums):\n    return max(nums)",
        [("[1, 7, 3]", 7), ("[-2, -9]", -2), ("[5]", 5)],
    ),
    (
        "list_min",
        "Write a function list_min(nums) that returns the smallest number in a non-empty list.",
        "def list_min(nums):\n    return min(nums)",
        [("[1, 7, 3]", 1), ("[-2, -9]", -9), ("[5]", 5)],
    ),
    (
        "count_items",
        "Write a function count_items(items) that returns how many items a list has.",
        "def count_items(items):\n    return len(items)",
        [("[1, 2, 3]", 3), ("[]", 0), ("['a']", 1)],
    ),
    (
        "reverse_string",
        "Write a function reverse_string(s) that returns the string s reversed.",
        "def reverse_string(s):\n    return s[::-1]",
        [("'abc'", "cba"), ("''", ""), ("'racecar'", "racecar")],
    ),
    (
        "to_upper",
        "Write a function to_upper(s) that returns s in upper case.",
        "def to_upper(s):\n    return s.upper()",
        [("'hello'", "HELLO"), ("'Abc1'", "ABC1"), ("''", "")],
    ),
    (
        "first_char",
        "Write a function first_char(s) that returns the first character of a non-empty string s.",
        "def first_char(s):\n    return s[0]",
        [("'hello'", "h"), ("'x'", "x"), ("'42'", "4")],
    ),
    (
        "last_element",
        "Write a function last_element(lst) that returns the last element of a non-empty list.",
        "def last_element(lst):\n    return lst[-1]",
        [("[1, 2, 3]", 3), ("['a', 'b']", "b"), ("[0]", 0)],
    ),
    (
        "string_length",
        "Write a function string_length(s) that returns the number of characters in s.",
        "def string_length(s):\n    return len(s)",
        [("'hello'", 5), ("''", 0), ("'a b'", 3)],
    ),
    (
        "is_palindrome",
        "Write a function is_palindrome(s) that returns True if s reads the same backwards.",
        "def is_palindrome(s):\n    return s == s[::-1]",
        [("'level'", True), ("'hello'", False), ("''", True)],
    ),
    (
        "count_vowels",
        "Write a function count_vowels(s) that returns how many vowels (a, e, i, o, u) the lower-case string s has.",
        "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou')",
        [("'hello'", 2), ("'sky'", 0), ("'aeiou'", 5)],
    ),
    (
        "factorial",
        "Write a function factorial(n) that returns n! for n >= 0.",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        [("0", 1), ("5", 120), ("3", 6)],
    ),
    (
        "fibonacci",
        "Write a function fibonacci(n) that returns the n-th Fibonacci number, "
        "with fibonacci(0) = 0 and fibonacci(1) = 1.",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        [("0", 0), ("1", 1), ("10", 55)],
    ),
    (
        "sum_to_n",
        "Write a function sum_to_n(n) that returns 1 + 2 + ... + n.",
        "def sum_to_n(n):\n    return n * (n + 1) // 2",
        [("1", 1), ("4", 10), ("100", 5050)],
    ),
    (
        "average",
        "Write a function average(nums) that returns the mean of a non-empty list of numbers.",
        "def average(nums):\n    return sum(nums) / len(nums)",
        [("[1, 2, 3]", 2.0), ("[5]", 5.0), ("[1, 2]", 1.5)],
    ),
    (
        "celsius_to_fahrenheit",
        "Write a function celsius_to_fahrenheit(c) that converts Celsius to Fahrenheit (c * 9 / 5 + 32).",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
        [("0", 32.0), ("100", 212.0), ("-40", -40.0)],
    ),
    (
        "is_positive",
        "Write a function is_positive(x) that returns True if x is greater than zero.",
        "def is_positive(x):\n    return x > 0",
        [("5", True), ("0", False), ("-3", False)],
    ),
    (
        "concat",
        "Write a function concat(a, b) that joins the strings a and b.",
        "def concat(a, b):\n    return a + b",
        [("'ab', 'cd'", "abcd"), ("'', 'x'", "x"), ("'hi', ''", "hi")],
    ),
    (
        "repeat_string",
        "Write a function repeat_string(s, n) that returns s repeated n times.",
        "def repeat_string(s, n):\n    return s * n",
        [("'ab', 3", "ababab"), ("'x', 0", ""), ("'-', 2", "--")],
    ),
    (
        "square_list",
        "Write a function square_list(nums) that returns a list with each number squared.",
        "def square_list(nums):\n    return [x * x for x in nums]",
        [("[1, 2, 3]", [1, 4, 9]), ("[]", []), ("[-2]", [4])],
    ),
    (
        "filter_even",
        "Write a function filter_even(nums) that returns the even numbers of a list, in order.",
        "def filter_even(nums):\n    return [x for x in nums if x % 2 == 0]",
        [("[1, 2, 3, 4]", [2, 4]), ("[1, 3]", []), ("[0]", [0])],
    ),
    (
        "count_char",
        "Write a function count_char(s, c) that returns how many times the character c occurs in s.",
        "def count_char(s, c):\n    return s.count(c)",
        [("'banana', 'a'", 3), ("'abc', 'z'", 0), ("'aaa', 'a'", 3)],
    ),
    (
        "is_divisible",
        "Write a function is_divisible(a, b) that returns True if a is divisible by b.",
        "def is_divisible(a, b):\n    return a % b == 0",
        [("10, 5", True), ("7, 2", False), ("0, 3", True)],
    ),
    (
        "sign",
        "Write a function sign(x) that returns 1 for a positive x, -1 for a negative x and 0 for zero.",
        "def sign(x):\n    return (x > 0) - (x < 0)",
        [("5", 1), ("-2", -1), ("0", 0)],
    ),
    (
        "greet",
        "Write a function greet(name) that returns the string 'Hello, ' followed by the name and '!'.",
        "def greet(name):\n    return 'Hello, ' + name + '!'",
        [("'Ada'", "Hello, Ada!"), ("'Bob'", "Hello, Bob!"), ("''", "Hello, !")],
    ),
    (
        "remove_spaces",
        "Write a function remove_spaces(s) that returns s without any space characters.",
        "def remove_spaces(s):\n    return s.replace(' ', '')",
        [("'a b c'", "abc"), ("'none'", "none"), ("'  '", "")],
    ),
    (
        "list_product",
        "Write a function list_product(nums) that returns the product of a list of numbers (1 for an empty list).",
        "def list_product(nums):\n    result = 1\n    for x in nums:\n        result *= x\n    return result",
        [("[2, 3, 4]", 24), ("[]", 1), ("[5, 0]", 0)],
    ),
    (
        "power",
        "Write a function power(x, n) that returns x raised to the power n.",
        "def power(x, n):\n    return x ** n",
        [("2, 10", 1024), ("5, 0", 1), ("3, 3", 27)],
    ),
    (
        "sort_list",
        "Write a function sort_list(nums) that returns the numbers sorted from smallest to largest.",
        "def sort_list(nums):\n    return sorted(nums)",
        [("[3, 1, 2]", [1, 2, 3]), ("[]", []), ("[5, -1, 5]", [-1, 5, 5])],
    ),
    (
        "unique_count",
        "Write a function unique_count(items) that returns how many different values a list has.",
        "def unique_count(items):\n    return len(set(items))",
        [("[1, 1, 2]", 2), ("[]", 0), ("['a', 'b', 'a']", 2)],
    ),
    (
        "half",
        "Write a function half(x) that returns x divided by 2.",
        "def half(x):\n    return x / 2",
        [("10", 5.0), ("3", 1.5), ("0", 0.0)],
    ),
]

# (id, question, reference program, [(stdin, expected stdout), ...])
STDIO = [
    (
        "sum_two",
        "Read two integers on one line, separated by a space, and print their sum.",
        "a, b = map(int, input().split())\nprint(a + b)",
        [("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("100 23\n", "123\n")],
    ),
    (
        "echo_reverse",
        "Read one line and print it reversed.",
        "print(input()[::-1])",
        [("hello\n", "olleh\n"), ("ab c\n", "c ba\n"), ("x\n", "x\n")],
    ),
    (
        "square_stdin",
        "Read an integer n and print n squared.",
        "n = int(input())\nprint(n * n)",
        [("3\n", "9\n"), ("-4\n", "16\n"), ("0\n", "0\n")],
    ),
    (
        "even_or_odd",
        "Read an integer and print EVEN if it is even, ODD otherwise.",
        "n = int(input())\nprint('EVEN' if n % 2 == 0 else 'ODD')",
        [("4\n", "EVEN\n"), ("7\n", "ODD\n"), ("0\n", "EVEN\n")],
    ),
    (
        "count_words",
        "Read one line and print how many words (separated by spaces) it has.",
        "print(len(input().split()))",
        [("a b c\n", "3\n"), ("hello\n", "1\n"), ("one  two\n", "2\n")],
    ),
    (
        "max_of_list",
        "The first line holds n; the second line holds n integers. Print the largest.",
        "input()\nprint(max(map(int, input().split())))",
        [("3\n1 9 4\n", "9\n"), ("1\n-7\n", "-7\n"), ("4\n2 2 2 2\n", "2\n")],
    ),
    (
        "count_up",
        "Read an integer n and print the numbers 1 to n, one per line.",
        "n = int(input())\nfor i in range(1, n + 1):\n    print(i)",
        [("3\n", "1\n2\n3\n"), ("1\n", "1\n"), ("0\n", "")],
    ),
    (
        "digit_sum",
        "Read a non-negative integer and print the sum of its digits.",
        "print(sum(int(d) for d in input().strip()))",
        [("123\n", "6\n"), ("0\n", "0\n"), ("9999\n", "36\n")],
    ),
]


def main() -> None:
    mbpp = []
    for i, (name, text, code, cases) in enumerate(FUNCTIONS):
        tests = [f"assert {name}({args}) == {expected!r}" for args, expected in cases]
        mbpp.append(
            {
                "task_id": f"lab-{i:03d}",
                "text": text,
                "code": code,
                "test_list": tests,
                "split": "test" if i % 4 == 3 else "train",
            }
        )
    apps = []
    for i, (pid, question, code, cases) in enumerate(STDIO):
        apps.append(
            {
                "problem_id": f"lab-io-{i:02d}-{pid}",
                "question": question,
                "solutions": [code],
                "input_output": json.dumps({"inputs": [c[0] for c in cases], "outputs": [c[1] for c in cases]}),
                "split": "test" if i % 4 == 3 else "train",
            }
        )
    for name, rows in (("code_problems", mbpp), ("code_problems_stdio", apps)):
        with (DATA / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"wrote {len(rows)} problems to {DATA / (name + '.jsonl')}")


if __name__ == "__main__":
    main()
