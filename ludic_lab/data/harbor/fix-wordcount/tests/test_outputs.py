"""The checks of fix-wordcount: the script's output on the shipped notes and on a new text."""

import subprocess
import sys
from pathlib import Path

APP = Path("/app")


def run(path):
    out = subprocess.run(
        [sys.executable, str(APP / "wordcount.py"), str(path)], capture_output=True, text=True, timeout=30, cwd=APP
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


def test_notes_counts_words_case_insensitively():
    lines = run(APP / "notes.txt")
    assert lines[:4] == ["the 4", "saw 3", "a 2", "bird 2"]


def test_ties_are_alphabetical(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("Zeta alpha ALPHA zeta beta")
    assert run(text)[:3] == ["alpha 2", "zeta 2", "beta 1"]


def test_script_still_exists():
    assert (APP / "wordcount.py").is_file()
