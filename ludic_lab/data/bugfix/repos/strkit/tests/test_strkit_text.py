from strkit import common_prefix, count_vowels, is_palindrome, reverse_words, slugify, truncate


def test_slugify_joins_words_with_dashes() -> None:
    assert slugify("Hello World") == "hello-world"


def test_slugify_collapses_punctuation_runs() -> None:
    assert slugify("  Rock & Roll -- 1955!! ") == "rock-roll-1955"


def test_slugify_of_punctuation_only_is_empty() -> None:
    assert slugify("!?") == ""


def test_is_palindrome_ignores_case_and_punctuation() -> None:
    assert is_palindrome("A man, a plan, a canal: Panama") is True


def test_is_palindrome_rejects_near_miss() -> None:
    assert is_palindrome("abca") is False


def test_is_palindrome_short_strings() -> None:
    assert is_palindrome("") is True
    assert is_palindrome("x") is True


def test_count_vowels_counts_both_cases() -> None:
    assert count_vowels("EducAtion") == 5


def test_count_vowels_without_vowels() -> None:
    assert count_vowels("rhythm") == 0


def test_truncate_keeps_short_text() -> None:
    assert truncate("hello", 5) == "hello"


def test_truncate_cuts_and_adds_suffix() -> None:
    assert truncate("hello world", 8) == "hello..."


def test_truncate_narrower_than_suffix() -> None:
    assert truncate("hello world", 2) == ".."


def test_reverse_words_reverses_order() -> None:
    assert reverse_words("one two three") == "three two one"


def test_reverse_words_normalises_spaces() -> None:
    assert reverse_words("  a   b ") == "b a"


def test_common_prefix_of_several_words() -> None:
    assert common_prefix(["interval", "internet", "interior"]) == "inter"


def test_common_prefix_without_shared_start() -> None:
    assert common_prefix(["dog", "cat"]) == ""


def test_common_prefix_of_one_word_and_of_none() -> None:
    assert common_prefix(["solo"]) == "solo"
    assert common_prefix([]) == ""


def test_common_prefix_when_one_word_is_the_prefix() -> None:
    assert common_prefix(["abc", "ab", "abd"]) == "ab"
