"""The tool output budget in tokens: what counting a result with the model's tokenizer costs.

Measured in one run, on the same texts, for each tokenizer (the tiny test model's, SmolLM2's):

  chars      ``OutputBudget(4000, 60000).fit(text)``: the default budget, in characters
  tokens     ``OutputBudget.for_tokenizer(tok, 1000, 15000).fit(text)``: the text counted, cut
             to 1000 tokens (the kept parts found by counting prefixes and suffixes), the shown
             text counted again
  count      one tokenization of the whole text (what ``tokens`` cannot do without)

on 100 KB texts (a command's output: ``seq``'s numbers; Python source) and a short one (a
200-character result, shown whole). ``tokens - chars`` is what the token budget adds to one tool
call; with bubblewrap installed the run also times the tool call it is added to: a
``WorkspaceTools.shell`` that prints 100 KB (the sandbox keeps its first and last 32 KiB) with
each budget. Timings depend on the machine's load, printed with the results; the peak resident
memory of the process is printed at the end.

    .venv/bin/python bench/workspace_budget.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def texts() -> dict[str, str]:
    seq = "".join(f"{i}\n" for i in range(1, 30000))[:100_000]
    source = "".join(p.read_text() for p in sorted((ROOT / "ludic_lab" / "envs" / "workspace").glob("*.py")))
    return {"seq 100 KB": seq, "code 100 KB": (source * (100_000 // len(source) + 1))[:100_000], "short": seq[:200]}


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def fit_ms(make: Callable[[], Any], text: str, repeat: int) -> float:
    return median_ms(lambda: make().fit(text, tool="shell"), repeat)


async def shell_ms(make: Callable[[], Any], repeat: int) -> float:
    """Median ms of ``WorkspaceTools.shell("seq 1 20000")`` (108,894 bytes of output) with ``make()``'s budget."""
    from ludic_lab.envs.workspace import WorkspacePool, WorkspaceTools

    times = []
    async with WorkspacePool(size=1) as pool, pool.workspace() as ws:
        tools = WorkspaceTools(ws, budget=make())
        for i in range(repeat + 1):
            tools.budget.reset()
            t0 = time.perf_counter()
            await tools.shell("seq 1 20000")
            if i:
                times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(repeat: int) -> None:
    from transformers import AutoTokenizer

    from ludic_lab.envs.workspace import OutputBudget
    from ludic_lab.envs.workspace.token_cut import token_counter
    from ludic_lab.inference.models import default_model_path, tiny_model_path

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; median of {repeat} calls")
    sandbox = shutil.which("bwrap") is not None
    for label, path in (("tiny test model", tiny_model_path()), ("SmolLM2-135M", default_model_path())):
        tok = AutoTokenizer.from_pretrained(path)
        count = token_counter(tok)

        def chars() -> OutputBudget:
            return OutputBudget(4000, 60_000)

        def tokens(tok: Any = tok) -> OutputBudget:
            return OutputBudget.for_tokenizer(tok, max_result_tokens=1000, episode_tokens=15_000)

        print(f"\n{label} tokenizer")
        print(f"  {'text':<12} {'tokens':>7} {'chars ms':>9} {'tokens ms':>10} {'count ms':>9} {'added ms':>9}")
        for name, text in texts().items():
            c, t = fit_ms(chars, text, repeat), fit_ms(tokens, text, repeat)
            n = median_ms(lambda text=text, count=count: count(text), repeat)
            print(f"  {name:<12} {count(text):>7} {c:>9.2f} {t:>10.2f} {n:>9.2f} {t - c:>9.2f}")
        if sandbox:
            sc, st = asyncio.run(shell_ms(chars, repeat)), asyncio.run(shell_ms(tokens, repeat))
            print(f"  a shell call printing 100 KB: {sc:.1f} ms with the chars budget, {st:.1f} ms with tokens "
                  f"(+{st - sc:.1f} ms, x{st / sc:.2f})")  # fmt: skip
    if not sandbox:
        print("\n(bwrap not installed: the shell call was not timed)")
    print(f"\npeak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="calls per figure (the median is printed)")
    main(ap.parse_args().repeat)
