"""Count the words of a text file: most frequent first, ties alphabetically."""

import re
import sys


def count_words(text):
    counts = {}
    for word in re.findall(r"[A-Za-z']+", text):
        counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def main(path):
    with open(path, encoding="utf-8") as f:
        for word, n in count_words(f.read()):
            print(word, n)


if __name__ == "__main__":
    main(sys.argv[1])
