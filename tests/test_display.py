"""How a data class displays in a notebook does not depend on what was imported: the data
classes declare ``_repr_html_`` and ask :mod:`ludic_lab.display`, and ``ludic_lab/__init__``
registers the lab's views once, importing them on the first display only."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from ludic_lab.display import html_of, register_html
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.types import Rollout, Step

ROOT = Path(__file__).resolve().parents[1]
VIEWS = ("ludic_lab.lab", "ludic_lab.lab.rollout_html", "ludic_lab.lab.saw_html", "ludic_lab.lab.token_html")


def _run(code: str) -> list[str]:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.splitlines()


def test_a_fresh_interpreter_displays_the_data_classes_after_importing_only_their_modules():
    out = _run(
        f"""
        import sys
        from ludic_lab.types import Rollout, Step
        from ludic_lab.rollouts.saw import SAWBatch, SAWItem
        views = {VIEWS!r}
        print([m in sys.modules for m in views])
        item = SAWItem(input_ids=(1, 2, 3), action_mask=(0, 1, 1), weights=(0.0, 1.0, 1.0),
                       behaviour_logprobs=(0.0, -0.5, -0.5), rollout_id="r0")
        rollout = Rollout(steps=(Step(0, "obs", "hello", "hello", None, reward=1.0),), id="r0")
        for obj in (rollout, item, SAWBatch((item,))):
            html = obj._repr_html_()
            print(type(obj).__name__, isinstance(html, str) and "ll-" in html)
        print([m in sys.modules for m in views])
        """
    )
    assert out == [
        "[False, False, False, False]",  # the data modules import no view
        "Rollout True",
        "SAWItem True",
        "SAWBatch True",
        "[True, True, True, True]",  # the first display loaded them
    ]


def test_the_rollout_side_loads_no_view():
    out = _run(
        f"""
        import sys
        import ludic_lab.rollouts
        print([m for m in sys.modules if m in {VIEWS!r} or m == "torch"])
        """
    )
    assert out == ["[]"]


def test_the_registry_falls_back_to_none_and_follows_subclasses():
    class Plain:
        pass

    assert html_of(Plain()) is None  # Jupyter then shows repr

    class Tagged(Plain):
        pass

    register_html(Plain, lambda obj: f"<b>{type(obj).__name__}</b>")
    assert html_of(Tagged()) == "<b>Tagged</b>"  # the nearest registered class in the MRO
    register_html(f"{Tagged.__module__}.{Tagged.__qualname__}", lambda obj: "<i>tagged</i>")
    assert html_of(Tagged()) == "<i>tagged</i>" and html_of(Plain()) == "<b>Plain</b>"


def test_the_data_classes_ask_the_registry():
    rollout = Rollout(steps=(Step(0, "obs", "hi", "hi", None, reward=0.0),))
    item = SAWItem(input_ids=(1, 2), action_mask=(0, 1), weights=(0.0, 1.0), behaviour_logprobs=(0.0, -1.0))
    for obj in (rollout, item, SAWBatch((item,))):
        assert obj._repr_html_() == html_of(obj) and "ll-" in (html_of(obj) or "")
