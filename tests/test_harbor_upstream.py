"""ludic_lab's Harbor loader and reward parsing against Harbor's own ``Task`` and ``Verifier``.

Those two classes need Python >= 3.12 (``typing.override``, PEP 701 f-strings), so they run in
a second interpreter: ``LUDIC_HARBOR_PYTHON`` names a Python >= 3.12 with ``harbor==0.26.0``
installed (``python3.12 -m venv V && V/bin/pip install harbor==0.26.0``; docs/harbor.md). The
shipped task folders must load to the same name, instruction, timeouts, test script and verifier
environment, and every reward-file case must give the same rewards, or the same error.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ludic_lab.task.harbor_task import HARBOR_DATA, load_harbor_tasks
from ludic_lab.task.harbor_verify import HarborRewardError, parse_rewards

pytest.importorskip("harbor.models.task.config", reason="harbor's task models: make setup-test installs them")
PYTHON = os.environ.get("LUDIC_HARBOR_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not PYTHON,
    reason="LUDIC_HARBOR_PYTHON is not set: a Python >= 3.12 with harbor==0.26.0 (python3.12 -m venv V && "
    "V/bin/pip install harbor==0.26.0; LUDIC_HARBOR_PYTHON=V/bin/python) runs Harbor's own Task and Verifier",
)

UPSTREAM = r"""
import json, sys, tempfile
from pathlib import Path
from types import SimpleNamespace
from harbor.models.task.task import Task
from harbor.models.verifier.result import VerifierResult
from harbor.verifier.verifier import Verifier

out = {"tasks": {}, "rewards": []}
for d in sorted(Path(sys.argv[1]).iterdir()):
    if (d / "task.toml").is_file():
        t = Task(d)
        out["tasks"][d.name] = {"name": t.name, "instruction": t.instruction, "agent": t.config.agent.timeout_sec,
                                "verifier": t.config.verifier.timeout_sec, "test": t.paths.discovered_test_path.name,
                                "env": dict(t.config.verifier.env)}
for as_json, as_text in json.loads(sys.argv[2]):
    with tempfile.TemporaryDirectory() as tmp:
        paths = SimpleNamespace(reward_json_path=Path(tmp) / "reward.json", reward_text_path=Path(tmp) / "reward.txt")
        if as_json is not None:
            paths.reward_json_path.write_text(as_json)
        if as_text is not None:
            paths.reward_text_path.write_text(as_text)
        verifier = SimpleNamespace(trial_paths=paths)  # the two parsers read only this
        try:
            if paths.reward_json_path.exists():
                rewards = Verifier._parse_reward_json(verifier)
            elif paths.reward_text_path.exists():
                rewards = Verifier._parse_reward_text(verifier)
            else:
                raise FileNotFoundError("no reward file")
            out["rewards"].append(["ok", VerifierResult(rewards=rewards).rewards])
        except Exception as e:
            out["rewards"].append(["error", type(e).__name__])
print(json.dumps(out))
"""
CASES = [
    [None, "0.5\n"], [None, " 0.25 "], [None, "1"], ['{"a": 1}', "0"], ['{"reward": true, "t": 3}', None],
    ["", None], [None, ""], [None, None], ["{", None], ['{"r": NaN}', None], ['{"reward": 1e309}', None],
    ['{"r": "1"}', None], ["1", None], ["[1]", None], [None, "one"], [None, "inf"],
]  # fmt: skip


def test_harbors_own_task_and_verifier_agree_with_ludic_lab() -> None:
    done = subprocess.run([PYTHON, "-c", UPSTREAM, str(HARBOR_DATA), json.dumps(CASES)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    folders, _ = load_harbor_tasks(HARBOR_DATA)
    mine = {f.path.name: {"name": f.name, "instruction": f.instruction, "agent": f.agent_timeout_s,
                          "verifier": f.verifier_timeout_s, "test": f.test_script, "env": dict(f.verifier_env)}
            for f in folders}  # fmt: skip
    assert mine == theirs["tasks"]
    for (as_json, as_text), (kind, value) in zip(CASES, theirs["rewards"], strict=True):
        if kind == "ok":
            assert parse_rewards(as_json, as_text) == value, (as_json, as_text)
        else:
            with pytest.raises(HarborRewardError):
                parse_rewards(as_json, as_text)
