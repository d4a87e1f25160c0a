"""Correctness of the code-execution stack: runners, cache, adapters, parser and CodeExecEnv.

Every shipped reference solution passes in the sandbox and a wrong one fails; partial credit;
cache hits skip the sandbox (counted); compile failures and timeouts get their rewards; a
failing attempt is fed back in multi-turn mode; APPS/MBPP rows from lists, JSONL and
``datasets.Dataset``; and a scripted agent runs the env through the real protocol.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.code_exec import RunConfig, SandboxPool, TestCase, run_tests
from ludic_lab.envs.code_exec.adapters import APPSAdapter, MBPPAdapter, assert_to_test, load_problems, shipped_problems
from ludic_lab.envs.code_exec.env import CodeExecConfig, CodeExecEnv
from ludic_lab.envs.code_exec.parsing import code_block_parser, extract_code
from ludic_lab.interaction import SingleAgentSyncProtocol
from tests.helpers import ScriptedChatClient, chatml_template

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap missing: scripts/install_system_deps.sh"
)


def _pool(**kw) -> SandboxPool:
    return SandboxPool(kw.pop("size", 2), **kw)


async def test_every_shipped_reference_passes_and_a_wrong_program_fails():
    mbpp, apps = shipped_problems("code_problems"), shipped_problems("code_problems_stdio")
    assert len(mbpp) >= 40 and len(apps) >= 8
    jobs = [(MBPPAdapter(), r) for r in mbpp] + [(APPSAdapter(), r) for r in apps]
    async with _pool() as pool:
        good = await asyncio.gather(*[run_tests(pool, a.reference_solution(r), a.tests(r)) for a, r in jobs])
        bad = await asyncio.gather(
            *[run_tests(pool, "def _nothing():\n    return None\nprint('wrong')", a.tests(r)) for a, r in jobs]
        )
    failing = [a.problem_id(r, i) for i, ((a, r), res) in enumerate(zip(jobs, good, strict=True)) if not res.all_passed]
    assert failing == []
    assert all(res.passed_count == 0 and not res.all_passed for res in bad)
    assert all(res.compiled for res in good + bad)


async def test_partial_credit_stop_on_first_failure_and_statuses():
    tests = [
        TestCase("call", "sort_list([3, 1, 2])", [1, 2, 3]),
        TestCase("call", "sort_list([])", []),
        TestCase("call", "sort_list([5, -1, 5])", [-1, 5, 5]),
    ]
    wrong = "def sort_list(nums):\n    return nums"
    async with _pool() as pool:
        full = await run_tests(pool, wrong, tests)
        stop = await run_tests(pool, wrong, tests, RunConfig(stop_on_first_failure=True))
        crash = await run_tests(pool, "def sort_list(nums):\n    return nums[10]", tests)
        syntax = await run_tests(pool, "def sort_list(nums)\n    return nums", tests)
    assert [r.status for r in full.results] == ["wrong_answer", "passed", "wrong_answer"]
    assert full.pass_rate == pytest.approx(1 / 3)
    assert [r.status for r in stop.results] == ["wrong_answer", "not_run", "not_run"] and stop.pass_rate == 0
    assert [r.status for r in crash.results] == ["runtime_error"] * 3 and "IndexError" in crash.results[0].stderr
    assert not syntax.compiled and "SyntaxError" in syntax.compile_error
    assert {r.status for r in syntax.results} == {"compile_error"}


async def test_cache_hits_skip_the_sandbox_and_are_counted():
    tests = [TestCase("stdio", "2 3\n", "5\n")]
    async with _pool(size=1) as pool:
        first = await run_tests(pool, "a, b = map(int, input().split())\nprint(a + b)", tests)
        runs = pool.executions
        second = await run_tests(pool, "a, b = map(int, input().split())\nprint(a + b)", tests)
        other_settings = await run_tests(
            pool, "a, b = map(int, input().split())\nprint(a + b)", tests, RunConfig(match="exact")
        )
    assert first.all_passed and not first.cached
    assert second.all_passed and second.cached and second.results == first.results
    assert pool.executions == runs + 1  # only the run under different settings executed
    assert not other_settings.cached
    assert pool.cache.stats["hits"] == 1 and pool.cache.stats["misses"] == 2


async def test_output_matching_rules():
    from ludic_lab.envs.code_exec import outputs_match

    assert outputs_match("3  \n\n", "3\n") and not outputs_match("3  \n", "3\n", "exact")
    assert outputs_match("1.0000001 2\n", "1 2", "tokens") and not outputs_match("1 2 3", "1 2", "tokens")
    tests = [TestCase("call", "half(3)", 1.5), TestCase("call", "pair()", (1, "a")), TestCase("call", "s()", {3, 1})]
    code = "def half(x):\n    return x / 2 + 1e-12\ndef pair():\n    return [1, 'a']\ndef s():\n    return {1, 3}"
    async with _pool(size=1) as pool:
        res = await run_tests(pool, code, tests)
        liar = await run_tests(
            pool, "class Eq:\n    def __eq__(self, o):\n        return True\ndef half(x):\n    return Eq()", tests[:1]
        )
    assert res.all_passed
    assert liar.results[0].status == "runtime_error"  # an object that claims equality cannot pass


def test_adapters_apps_and_mbpp_formats(tmp_path):
    apps_io = {"question": "Echo", "input_output": json.dumps({"inputs": ["a\n"], "outputs": ["a\n"]})}
    apps_lists = {"question": "Echo", "inputs": [["x", "y"]], "outputs": [["x", "y"]]}
    apps_fn = {"question": "Add", "input_output": {"inputs": [[1, 2]], "outputs": [[3]], "fn_name": "add"}}
    a = APPSAdapter()
    assert a.tests(apps_io) == [TestCase("stdio", "a\n", "a\n", id="test_0")]
    assert a.tests(apps_lists)[0].input == "x\ny"
    assert a.tests(apps_fn) == [TestCase("call", "add(*[1, 2])", 3, id="test_0")]
    assert "stdin" in a.prompt(apps_io) and "stdin" not in a.prompt(apps_fn)
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        a.tests({"question": "q", "inputs": ["1", "2"], "outputs": ["1"]})
    assert assert_to_test("assert f(1, [2]) == (3, 'x')") == TestCase("call", "f(1, [2])", (3, "x"), id="test_0")
    assert assert_to_test("assert f(1) == g(2)").kind == "assert"
    assert assert_to_test("assert abs(f(1) - 2.5) < 1e-6").kind == "assert"
    row = {"task_id": 7, "text": "Write f.", "test_list": ["assert f(1) == 2", "assert f(2) == 4"]}
    m = MBPPAdapter()
    assert m.problem_id(row, 0) == "7" and "assert f(1) == 2" in m.prompt(row) and "f(2)" not in m.prompt(row)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert load_problems(path) == [row]
    import datasets

    ds = datasets.Dataset.from_list([row])
    assert load_problems(ds) is ds


def test_code_block_parser():
    parse = code_block_parser()
    assert parse("Sure!\n```python\ndef f():\n    return 1\n```\nThat is it.").action == "def f():\n    return 1"
    assert parse("```\nx = 1\n```\n```python\nx = 2\n```").action == "x = 2"  # the last block
    assert parse("def f(x): return x").action == "def f(x): return x"  # bare code, allowed by default
    bad = parse("I think the answer is 42.")
    assert bad.action is None and bad.reward < 0 and "```python" in bad.obs
    assert code_block_parser(allow_bare=False)("def f(): pass").action is None
    # the opening fence skipped (the model took it as said): code, a lone closing fence, prose
    closed = "def f(x):\n    return x + 1\n```\nThis adds one."
    assert parse(closed).action == "def f(x):\n    return x + 1"
    assert parse("x = 1\n```\nthen:\n```python\nx = 2\n```").action == "x = 2"  # still the last block
    assert parse("Answer: 42\n```\nprint(42)").action == "print(42)"  # prose first: an unclosed block
    assert extract_code(None) is None and extract_code("```bash\nls\n```") is None


async def test_env_rewards_compile_failure_timeout_and_info():
    rows = shipped_problems("code_problems")
    cfg = CodeExecConfig(run=RunConfig(per_test_timeout_s=0.5), compile_failure_reward=-0.5, timeout_reward=-0.2)
    async with _pool() as pool:
        env = CodeExecEnv(rows, pool=pool, config=cfg)
        await env.reset(seed=0)  # add(a, b)
        ok = (await env.step({"agent_0": rows[0]["code"]}))["agent_0"]
        await env.reset(seed=0)
        comp = (await env.step({"agent_0": "def add(a, b) return a"}))["agent_0"]
        await env.reset(seed=0)
        slow = (await env.step({"agent_0": "def add(a, b):\n    while True:\n        pass"}))["agent_0"]
        await env.reset(seed=0)
        part = (await env.step({"agent_0": "def add(a, b):\n    return 0"}))["agent_0"]
    assert ok.reward == 1.0 and ok.terminated and ok.info["all_passed"] and ok.info["total"] == 3
    assert [t["status"] for t in ok.info["test_results"]] == ["passed"] * 3
    json.dumps(ok.info)  # travels in rollouts
    assert comp.reward == -0.5 and comp.info["compile_failed"] and "does not compile" in comp.obs
    assert slow.reward == -0.2 and slow.info["timed_out"]
    assert part.reward == pytest.approx(1 / 3)  # add(-4, 4) == 0 passes


async def test_multi_turn_feeds_the_failure_back_until_it_passes():
    tpl = chatml_template()
    replies = ["```python\ndef double(x):\n    return x + 2\n```", "```python\ndef double(x):\n    return 2 * x\n```"]
    rows = shipped_problems("code_problems")
    async with _pool() as pool:
        env = CodeExecEnv(rows, pool=pool, config=CodeExecConfig(max_attempts=3))
        agent = Agent(ScriptedChatClient(replies, chat_template=tpl), FullDialog(), CodeExecEnv.recommended_parser())
        [r] = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=5, env_seed=5)  # double(x)
    first, second = r.steps
    assert not first.terminated and first.reward == 0.0 and first.info["passed"] == 0
    assert "Expected: 8" in first.next_obs and "Got: 6" in first.next_obs and "Fix the program" in first.next_obs
    assert second.terminated and second.reward == 1.0 and second.info["attempt"] == 2


async def test_check_env_accepts_the_code_env():
    from ludic_lab.envs import check_env_async

    rows = shipped_problems("code_problems")[:3]
    async with _pool(size=1) as pool:
        env = CodeExecEnv(rows, pool=pool, config=CodeExecConfig(max_attempts=2))
        # replay is not compared: info carries measured wall/CPU times and the cache hit
        report = await check_env_async(
            env, actions=["def add(a, b):\n    return 0", rows[0]["code"]], check_replay=False
        )
    assert report.num_steps == 2 and report.returns["agent_0"] == pytest.approx(1 / 3 + 1)


async def test_run_python_tool_runs_in_the_sandbox():
    from transformers.utils import get_json_schema

    from ludic_lab.envs.code_exec.tool import run_python_tool

    async with _pool(size=1) as pool:
        tool = run_python_tool(pool, timeout_s=1)
        schema = get_json_schema(tool)
        ok = await tool("print(6 * 7)")
        bad = await tool("import os\nprint(sorted(os.listdir('/')))\n1/0")
        slow = await tool("while True:\n    pass")
    assert schema["function"]["name"] == "run_python" and "code" in schema["function"]["parameters"]["properties"]
    assert ok.strip() == "42"
    assert "'work'" not in bad and "ZeroDivisionError" in bad and "exited with status 1" in bad
    assert "stopped" in slow


async def test_a_program_that_kills_its_harness_fails_its_tests():
    tests = [TestCase("stdio", "", "x\n", id=f"t{i}") for i in range(3)]
    async with _pool(size=1) as pool:
        res = await run_tests(pool, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('x')", tests)
        again = await run_tests(pool, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('x')", tests)
    assert [r.status for r in res.results] == ["runtime_error", "not_run", "not_run"] and res.pass_rate == 0
    assert again.cached  # a program's own failure is cached; only sandbox failures and timeouts are not
