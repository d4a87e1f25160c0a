"""Write ``ludic_lab/data/bugfix_tasks.jsonl``: bugs injected into the small repositories of
``ludic_lab/data/bugfix/repos/``, kept when their tests catch them (docs/bugfix_tasks.md).

Deterministic for a seed (the shipped file: seed 0). Run: ``python scripts/make_bugfix_tasks.py``;
``--check`` regenerates and compares with the shipped file, writing nothing.
"""

from __future__ import annotations

from ludic_lab.data.bugfix.make import main

if __name__ == "__main__":
    raise SystemExit(main())
