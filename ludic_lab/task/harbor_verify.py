"""Harbor's verifier over a finished workspace: ``tests/`` run, the reward file read as Harbor reads it.

    verdict = await run_harbor_verifier(ws, folder)   # after the episode
    verdict.reward, verdict.rewards, verdict.tests, verdict.error

One command in the episode's workspace, in a fresh sandbox (no process of the episode is
alive): the task's ``tests/`` (Harbor's file filter applied) are unpacked into the command's
private ``/tmp``, seen at ``/tests`` (the sandbox's links), stale reward files cannot exist
(``/logs`` is in that fresh ``/tmp`` too), and the test script runs from the working directory
as Harbor runs it (``/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1``, with
``[verifier].env``, within ``[verifier].timeout_sec``). A small program then reads back
``reward.json`` (first) or ``reward.txt``, and per-test results where the script left them
(``ctrf.json``, Harbor's template's, or a JUnit ``junit.xml``). :func:`parse_rewards` parses
them exactly as Harbor's ``Verifier`` does; a missing, empty or malformed reward file is
Harbor's error, and reward 0 here. As in Harbor, code the tests import could write the reward
file itself: a reward is as trustworthy as the task's tests.
"""

from __future__ import annotations

import base64
import io
import json
import math
import secrets
import shlex
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ludic_lab.envs.workspace.workspace import Workspace
    from ludic_lab.task.harbor_folder import HarborTaskFolder

MAX_INLINE = 60_000
"""A payload up to this long rides in the command; a longer one is written to the workspace first."""
PAYLOAD = ".ludic_harbor_payload.b64"
_COLLECT = r"""
import json, os, sys
V = "/logs/verifier"
def read(name, limit):
    p = os.path.join(V, name)
    if not os.path.isfile(p):
        return None
    with open(p, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")
out = {"json": read("reward.json", 65536), "txt": read("reward.txt", 4096), "tests": {}}
ctrf = read("ctrf.json", 1 << 20)
if ctrf:
    try:
        for t in json.loads(ctrf)["results"]["tests"][:500]:
            out["tests"][str(t.get("name"))[:300]] = str(t.get("status"))[:20]
    except Exception as e:
        out["tests_error"] = "ctrf.json: " + repr(e)[:200]
if os.path.isfile(os.path.join(V, "junit.xml")) and not out["tests"]:
    try:
        import xml.etree.ElementTree as ET
        for case in list(ET.parse(os.path.join(V, "junit.xml")).getroot().iter("testcase"))[:500]:
            kinds = {c.tag for c in case}
            status = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            out["tests"][(case.get("classname", "") + "::" + case.get("name", ""))[:300]] = status
    except Exception as e:
        out["tests_error"] = "junit.xml: " + repr(e)[:200]
stdout = read("test-stdout.txt", 1 << 22) or ""
out["stdout"] = stdout[-2000:]
print(sys.argv[1] + json.dumps(out))
"""


class HarborRewardError(ValueError):
    """The reward file is missing, empty or not what Harbor accepts (Harbor's own error name first)."""


@dataclass(frozen=True)
class HarborVerdict:
    """One verification: Harbor's rewards dict, the scalar trained on, per-test results."""

    rewards: dict[str, float | int] | None
    """What Harbor's ``VerifierResult.rewards`` holds (``{"reward": x}`` from reward.txt)."""
    reward: float
    """``rewards["reward"]``; else the only value; else their mean; 0.0 on an error."""
    tests: dict[str, str] = field(default_factory=dict)
    """Per-test status from ctrf.json or junit.xml, where the test script left one."""
    error: str | None = None
    """Why there is no reward (Harbor's error: no reward file, an empty or malformed one, ...)."""
    tests_error: str | None = None
    """Why the per-test report could not be read (the reward stands)."""
    exit_code: int | None = None
    stop_reason: str = "exited"
    wall_s: float = 0.0
    test_stdout: str = ""
    """The end of ``/logs/verifier/test-stdout.txt``."""

    def to_info(self) -> dict[str, Any]:
        """JSON-ready, for a step's info."""
        run = {"error": self.error, "tests_error": self.tests_error, "exit_code": self.exit_code,
               "stop_reason": self.stop_reason, "wall_s": self.wall_s, "test_stdout": self.test_stdout}  # fmt: skip
        return {"rewards": self.rewards, "tests": dict(self.tests), "verifier": run}

    def summary(self) -> str:
        if self.error:
            return f"The verifier gave no reward: {self.error}"
        return f"Verifier rewards: {json.dumps(self.rewards)}."


def parse_rewards(reward_json: str | None, reward_txt: str | None) -> dict[str, float | int]:
    """The rewards as Harbor's ``Verifier`` reads them: reward.json first (an object of finite
    numbers), else reward.txt (one finite float, as ``{"reward": x}``); Harbor's own
    ``VerifierResult`` then validates the dict (a bare number in reward.json is its error too)."""
    if reward_json is not None:
        if not reward_json:
            raise HarborRewardError("RewardFileEmptyError: reward file is empty at /logs/verifier/reward.json")
        try:
            rewards = json.loads(reward_json)
        except ValueError as e:
            raise HarborRewardError("VerifierOutputParseError: failed to parse rewards from JSON file "
                                    f"/logs/verifier/reward.json ({e})") from e  # fmt: skip
        values = rewards.values() if isinstance(rewards, dict) else [rewards]
        for value in values:
            if not isinstance(value, int | float):
                raise HarborRewardError(f"VerifierOutputParseError: non-numeric reward {value!r} in reward.json")
            if isinstance(value, float) and not math.isfinite(value):
                raise HarborRewardError(f"VerifierOutputParseError: non-finite reward {value!r} in reward.json")
        return _verifier_result(rewards)
    if reward_txt is not None:
        if not reward_txt:
            raise HarborRewardError("RewardFileEmptyError: reward file is empty at /logs/verifier/reward.txt")
        try:
            value = float(reward_txt)
        except ValueError as e:
            raise HarborRewardError(f"VerifierOutputParseError: failed to parse rewards from text file "
                                    f"/logs/verifier/reward.txt ({reward_txt[:80]!r})") from e  # fmt: skip
        if not math.isfinite(value):
            raise HarborRewardError(f"VerifierOutputParseError: non-finite reward {value!r} in reward.txt")
        return _verifier_result({"reward": value})
    raise HarborRewardError("RewardFileNotFoundError: no reward file found at /logs/verifier/reward.txt or "
                            "/logs/verifier/reward.json")  # fmt: skip


def _verifier_result(rewards: Any) -> dict[str, float | int]:
    from harbor.models.verifier.result import VerifierResult

    try:
        checked = VerifierResult(rewards=rewards).rewards
    except ValueError as e:  # pydantic's ValidationError
        msg = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e)
        raise HarborRewardError(f"VerifierResult: rewards: {msg} (got {rewards!r:.80})") from e
    return dict(checked or {})


def scalar_reward(rewards: Mapping[str, float | int]) -> float:
    """The number trained on: ``rewards["reward"]``, else the only value, else the mean."""
    if "reward" in rewards:
        return float(rewards["reward"])
    values = [float(v) for v in rewards.values()]
    return sum(values) / len(values) if values else 0.0


def folder_payload(source: Path, task_dir: Path) -> str:
    """``source`` (Harbor's file filter applied) as base64 of a gzipped tar."""
    from ludic_lab.task.harbor_folder import harbor_models

    selection = harbor_models().TaskFileFilter(task_dir).select(source)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in sorted(selection.relative_paths):
            tar.add(source / rel, arcname=rel.as_posix(), recursive=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


async def unpack_command(ws: Workspace, payload: str, dest: str) -> str:
    """Shell lines that unpack ``payload`` into ``dest`` (the payload written to the workspace
    by ``write_file`` first when it is too long for a command line)."""
    q = shlex.quote(dest)
    if len(payload) <= MAX_INLINE:
        return f"mkdir -p {q} && printf %s '{payload}' | base64 -d | tar -xzf - -C {q} --no-same-owner"
    await ws.write_file(PAYLOAD, payload)
    return f"mkdir -p {q} && base64 -d /workspace/{PAYLOAD} | tar -xzf - -C {q} --no-same-owner && rm -f /workspace/{PAYLOAD}"  # noqa: E501


async def run_harbor_verifier(ws: Workspace, folder: HarborTaskFolder) -> HarborVerdict:
    """Run ``folder``'s tests over ``ws`` as Harbor's verifier does (module docstring)."""
    unpack = await unpack_command(ws, folder_payload(folder.tests_dir, folder.path), "/tmp/harbor/tests")
    nonce = "HARBOR-" + secrets.token_hex(8) + ":"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in folder.verifier_env.items())
    script = shlex.quote("/tests/" + folder.test_script)
    python = ws.pool.setup.interpreter.executable if ws.pool.setup is not None else "python3"
    command = "\n".join([
        "rm -rf /tmp/harbor && mkdir -p /tmp/harbor/logs/verifier /tmp/harbor/logs/agent /tmp/harbor/logs/artifacts",
        unpack,
        f"chmod +x {script}",
        f"cd {shlex.quote(folder.workdir)}",
        f"({exports}{script}) > /logs/verifier/test-stdout.txt 2>&1",  # Harbor's build_execution_command
        "status=$?",
        f"{shlex.quote(python)} -I -S -c {shlex.quote(_COLLECT)} {nonce}",
        "exit $status",
    ])  # fmt: skip
    result = await ws.run(command, timeout_s=folder.verifier_timeout_s)
    common: dict[str, Any] = {"exit_code": result.exit_code, "stop_reason": result.stop_reason,
                              "wall_s": round(result.wall_s, 3)}  # fmt: skip
    found = None
    for line in reversed(result.output.splitlines()):
        if line.startswith(nonce):
            try:
                found = json.loads(line[len(nonce) :])
            except ValueError:
                found = None
            break
    if not isinstance(found, dict):
        why = "timed out" if result.timed_out else result.stop_reason
        return HarborVerdict(None, 0.0, error=f"the verifier's command ended without a report ({why}): "
                             f"{result.output.strip()[-300:]}", **common)  # fmt: skip
    tests = {str(k): str(v) for k, v in (found.get("tests") or {}).items()}
    stdout = str(found.get("stdout") or "")
    try:
        rewards = parse_rewards(found.get("json"), found.get("txt"))
    except HarborRewardError as e:
        return HarborVerdict(None, 0.0, tests, error=str(e), test_stdout=stdout, **common)
    return HarborVerdict(rewards, scalar_reward(rewards), tests, tests_error=found.get("tests_error"),
                         test_stdout=stdout, **common)  # fmt: skip


async def run_harbor_solution(ws: Workspace, folder: HarborTaskFolder, *, timeout_s: float | None = None) -> Any:
    """Harbor's oracle: ``solution/`` at ``/solution``, its solve script run from the working
    directory in ``ws`` (``[solution].env`` set); the :class:`CommandResult`."""
    if folder.solve_script is None:
        raise ValueError(f"Harbor task {folder.name!r} has no solution/solve.sh")
    unpack = await unpack_command(ws, folder_payload(folder.solution_dir, folder.path), "/tmp/harbor/solution")
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in folder.config.solution.env.items())
    script = shlex.quote("/solution/" + folder.solve_script)
    command = f"rm -rf /tmp/harbor && {unpack}\nchmod +x {script}\ncd {shlex.quote(folder.workdir)}\n{exports}{script}"
    return await ws.run(command, timeout_s=timeout_s or folder.agent_timeout_s or 600.0)
