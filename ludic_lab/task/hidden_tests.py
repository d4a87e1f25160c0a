"""Hidden tests: a repository task's reward, run after the episode over its final workspace.

    report = await run_hidden_tests(ws, fail_to_pass=("tests/t.py::test_a",), test_files={...})
    report.resolved, report.outcomes, report.reward(partial=False)

One command in the episode's workspace, in a fresh sandbox (no process of the episode is
alive: none outlives its command), with the task's own copy of its test files as its payload
(written by ``write_file`` first when it is too long for a command line):

1. removes what could steer pytest or stand in for the tests: every ``conftest.py``, the
   configuration files pytest reads at the root (:data:`PYTEST_CONFIG_FILES`), the paths of
   ``remove`` (the test folders, whole: a test file the agent added goes too) and every
   restored path (a link planted there goes, not its target);
2. writes the task's test files back, so an agent that edited or deleted a test gains nothing;
3. runs ``python -P -m pytest`` on the hidden node ids: ``-P`` keeps the workspace off the
   front of ``sys.path`` (a ``pytest.py`` or ``json.py`` left there is not imported in place of
   pytest's own), plugins are not auto-loaded (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, also
   ~1.2 s less per start here), and each test's outcome is read from pytest's short summary
   (``-rfEpxX``: a line ``PASSED <node id>`` per passing test).

A test passes only on its own ``PASSED`` line (a test that errors in teardown does not);
a test with no line at all (a collection error, a timeout) is ``missing``. The code under test
runs in pytest's process, so it could forge that report, as it could forge SWE-bench's logs:
restoring the tests and the configuration closes the cheap ways, not that one.
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
import shlex
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ludic_lab.envs.workspace.results import WorkspaceFileError

if TYPE_CHECKING:
    from ludic_lab.envs.workspace.workspace import Workspace

Outcome = Literal["passed", "failed", "error", "xfailed", "xpassed", "missing"]
PYTEST_CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "pytest.py")
"""Removed from the workspace's root before the hidden run (restored when the task ships one)."""
NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"
PYTEST_ARGS = ("-p", "no:cacheprovider", "-q", "--tb=no", "-rfEpxX")
PAYLOAD = ".ludic_hidden_tests.b64"
MAX_INLINE_PAYLOAD = 40_000
"""A payload up to this long is written by the run's own command, a longer one by ``write_file`` first."""
MAX_IDS_CHARS = 40_000
"""Node ids longer than this in all are not named on the command line (the whole suite runs)."""
_RESTORE = (
    "import base64, json, os, zlib\n"
    f"files = json.loads(zlib.decompress(base64.b64decode(open({PAYLOAD!r}, 'rb').read())))\n"
    "for path, text in files.items():\n"
    "    folder = os.path.dirname(path)\n"
    "    if folder:\n"
    "        os.makedirs(folder, exist_ok=True)\n"
    "    with open(path, 'w', encoding='utf-8', newline='') as f:\n"
    "        f.write(text)\n"
    f"os.unlink({PAYLOAD!r})\n"
)


@dataclass(frozen=True)
class TestReport:
    """The hidden tests of one episode: each node id's outcome and how the run ended."""

    __test__ = False  # not a pytest class

    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    outcomes: dict[str, Outcome]
    """Node id -> ``passed``, ``failed``, ``error``, ``xfailed``, ``xpassed`` or ``missing``."""
    exit_code: int | None = None
    stop_reason: str = "exited"
    """How the run's command ended (:class:`~ludic_lab.envs.workspace.CommandResult`'s ``stop_reason``)."""
    wall_s: float = 0.0
    output: str = ""
    """The summary lines and pytest's last lines (for a reader; not what the outcomes trust more)."""
    error: str | None = None
    """Why the tests could not be restored (e.g. the episode used up its disk quota); then none ran."""

    @property
    def passed(self) -> int:
        return sum(o == "passed" for o in self.outcomes.values())

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def resolved(self) -> bool:
        """Every hidden test passed (SWE-bench's *resolved*)."""
        return self.total > 0 and self.passed == self.total

    def reward(self, partial: bool = False) -> float:
        """1.0 when resolved else 0.0; with ``partial``, the fraction of hidden tests passing."""
        if partial:
            return self.passed / self.total if self.total else 0.0
        return 1.0 if self.resolved else 0.0

    def to_info(self) -> dict[str, Any]:
        """JSON-ready, for a step's info: the outcomes, the counts of both lists, the run."""

        def count(ids: tuple[str, ...]) -> dict[str, int]:
            return {"passed": sum(self.outcomes.get(i) == "passed" for i in ids), "total": len(ids)}

        return {
            "tests": dict(self.outcomes),
            "fail_to_pass": count(self.fail_to_pass),
            "pass_to_pass": count(self.pass_to_pass),
            "hidden_tests": {
                "exit_code": self.exit_code,
                "stop_reason": self.stop_reason,
                "wall_s": self.wall_s,
                "error": self.error,
            },  # fmt: skip
        }

    def summary(self) -> str:
        """One line for the episode's last observation."""
        if self.error:
            return f"The hidden tests could not run: {self.error}"
        f2p = sum(self.outcomes.get(i) == "passed" for i in self.fail_to_pass)
        verdict = "resolved" if self.resolved else "not resolved"
        return (f"Hidden tests: {self.passed}/{self.total} passed ({f2p}/{len(self.fail_to_pass)} of those that "
                f"showed the bug); {verdict}.")  # fmt: skip


def check_relative(path: str) -> str:
    """``path`` if it is a plain relative POSIX path inside the repository, else ``ValueError``."""
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == "." or norm.startswith("../") or norm == ".." or "\0" in path:
        raise ValueError(f"a restored or removed path must be relative and stay inside the repository, got {path!r}")
    return norm


def restore_script(test_files: Mapping[str, str], remove: Sequence[str] = ()) -> tuple[str, str]:
    """``(payload, command)``: the payload (written to :data:`PAYLOAD` first) holds the files;
    the command removes what could steer pytest, then writes them back (module docstring)."""
    files = {check_relative(p): text for p, text in sorted(test_files.items())}
    gone = sorted({check_relative(p) for p in remove} | set(files) | set(PYTEST_CONFIG_FILES))
    payload = base64.b64encode(zlib.compress(json.dumps(files).encode("utf-8"), 9)).decode("ascii")
    command = "\n".join(
        [
            "set -e",
            "find . -path ./.git -prune -o -name conftest.py -exec rm -rf -- {} +",
            "rm -rf -- " + " ".join(shlex.quote(p) for p in gone),
            f"python -P -c {shlex.quote(_RESTORE)}",
            "set +e",
        ]
    )
    return payload, command


def pytest_command(node_ids: Sequence[str], args: Sequence[str] = PYTEST_ARGS) -> str:
    """The hidden run: pytest on ``node_ids`` (all of the suite when they are too long to
    name), its report in the sandbox's ``/tmp``, then only the summary lines and its end."""
    ids = " ".join(shlex.quote(i) for i in node_ids)
    named = ids if len(ids) <= MAX_IDS_CHARS else ""
    run = f"{NO_AUTOLOAD} python -P -m pytest {' '.join(shlex.quote(a) for a in args)} {named}".rstrip()
    return "\n".join(
        [
            f"{run} > /tmp/hidden.txt 2>&1",
            "status=$?",
            "grep -E '^(PASSED|FAILED|ERROR|XPASS|XFAIL) ' /tmp/hidden.txt",
            "echo '-----'",
            "tail -n 3 /tmp/hidden.txt",
            "exit $status",
        ]
    )


_WORDS: tuple[tuple[str, Outcome], ...] = (
    ("ERROR", "error"),
    ("FAILED", "failed"),
    ("XPASS", "xpassed"),
    ("XFAIL", "xfailed"),
    ("PASSED", "passed"),
)


def parse_outcomes(output: str, node_ids: Sequence[str]) -> dict[str, Outcome]:
    """Each node id's outcome from pytest's short summary lines (``WORD <id>`` or ``WORD <id> -
    message``); an error (in set-up or teardown) wins over a pass; no line: ``missing``."""
    seen: dict[str, set[str]] = {}
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR", "XPASS", "XFAIL"):
            seen.setdefault(word, set()).add(rest)
    found: dict[str, Outcome] = {}
    for node in node_ids:
        found[node] = "missing"
        for word, outcome in _WORDS:
            lines = seen.get(word, set())
            if node in lines or any(r.startswith(f"{node} - ") for r in lines):
                found[node] = outcome
                break
    return found


@dataclass(frozen=True)
class HiddenTests:
    """What one task's reward runs: the node ids and the files restored first."""

    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    test_files: Mapping[str, str] = field(default_factory=dict)
    """The task's own copy of its tests and pytest configuration (path -> text), written back
    over the final tree before the run."""
    remove: tuple[str, ...] = ()
    """Paths removed from the final tree first (e.g. ``"tests"``: the test folder, whole)."""
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.fail_to_pass and not self.pass_to_pass:
            raise ValueError("HiddenTests needs at least one node id (fail_to_pass or pass_to_pass)")
        restore_script(self.test_files, self.remove)  # the paths are checked now, not after an episode

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.fail_to_pass + self.pass_to_pass))

    async def run(self, ws: Workspace) -> TestReport:
        """Restore the tests in ``ws``, run them, read each outcome (module docstring)."""
        report = TestReport(self.fail_to_pass, self.pass_to_pass, dict.fromkeys(self.node_ids, "missing"))
        payload, restore = restore_script(self.test_files, self.remove)
        if len(payload) <= MAX_INLINE_PAYLOAD:  # one sandbox run instead of two (base64 needs no quoting)
            restore = f"rm -rf -- {PAYLOAD}\nprintf %s '{payload}' > {PAYLOAD}\n{restore}"
        else:
            try:
                await ws.write_file(PAYLOAD, payload)
            except WorkspaceFileError as e:  # the episode's doing (a quota used up, a folder in the way)
                return _with(report, error=f"restoring the tests failed: {e}")
        result = await ws.run(f"{restore}\n{pytest_command(self.node_ids)}", timeout_s=self.timeout_s)
        text = result.output
        if result.stop_reason == "sandbox_error":
            from ludic_lab.envs.code_exec.sandbox import SandboxCrashError

            raise SandboxCrashError(f"the hidden tests' sandbox failed: {text.strip()[-300:]}")
        error = None
        if "-----" not in text and not result.timed_out:
            error = f"restoring the tests failed: {_tail(text)}"
        return _with(report, outcomes=parse_outcomes(text, self.node_ids), exit_code=result.exit_code,
                     stop_reason=result.stop_reason, wall_s=round(result.wall_s, 3), output=_tail(text, 2000),
                     error=error)  # fmt: skip


def _with(report: TestReport, **changes: Any) -> TestReport:
    import dataclasses

    return dataclasses.replace(report, **changes)


def _tail(text: str, chars: int = 300) -> str:
    text = re.sub(r"\n{3,}", "\n\n", text.strip())
    return text if len(text) <= chars else "..." + text[-chars:]
