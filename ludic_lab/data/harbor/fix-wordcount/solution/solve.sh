#!/bin/bash
cd /app
python - <<'PY'
from pathlib import Path

p = Path("wordcount.py")
p.write_text(p.read_text().replace('re.findall(r"[A-Za-z\']+", text)', 're.findall(r"[A-Za-z\']+", text.lower())'))
PY
