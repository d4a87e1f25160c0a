"""``%%ludic_export`` / ``export_cells`` / ``export_notebook``: a notebook's training cell
becomes a script that trains with ``python`` and under ``torchrun --nproc_per_node=2``
(gloo, CPU); what cannot be exported is an error naming it; the magic works in a real kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic_lab.lab.export import ExportError, build_script, export_cells, export_notebook, free_names

PY = sys.executable

# -- a tutorial-style notebook: parameters, exported helpers, an exploration cell, training ---
PARAMS = """\
#| parameters
import os

MODEL = "tiny"        # model folder, or "tiny" / "default"
STEPS = 3             # optimizer steps
PROMPTS = 4           # prompts (GRPO groups) per step
GROUP_SIZE = 4
MAX_TOKENS = 8
LR = 6e-3
METRICS = "metrics.jsonl"

if os.environ.get("LUDIC_SMOKE") == "1":  # CI's quick pass through the notebook
    STEPS = 1
"""

ENV_CELL = """\
#| export
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.types import StepOutcome


class DigitsEnv(SingleAgentEnv):
    \"\"\"One turn; reward = fraction of digit characters in the reply.\"\"\"

    def env_reset(self, *, seed=None):
        self._obs = f"Write some digits. ({seed})"
        return self._obs, {}

    def env_step(self, action):
        s = action.strip()
        reward = sum(ch.isdigit() for ch in s) / max(1, len(s))
        return StepOutcome(obs="ok", reward=reward, truncated=False, terminated=True, info={})

    def env_current_obs(self):
        return self._obs
"""

ENGINE_CELL = """\
#| export
from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.inference import InferenceSpec, LocalChatClient, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
)
from ludic_lab.training import make_grpo

client = LocalChatClient(MODEL, max_batch_size=PROMPTS * GROUP_SIZE)
engine = RolloutEngine(
    {"digits": DigitsEnv},
    {"agent": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), identity_parser))},
)
spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=MAX_TOKENS), ReturnSpec.for_training())
calls = [0]


def next_prompts():
    calls[0] += 1
    return [RolloutRequest(env=EnvSpec("digits"), protocol=ProtocolSpec("agent"), env_seed=calls[0] * 100 + i,
                           inference=spec) for i in range(PROMPTS)]


algo = make_grpo()
source = RolloutBatchSource(engine, next_prompts, algo.credit_assigner,
                            request_strategy=GRPORequestStrategy(GROUP_SIZE, seed=0))
"""

EXPLORE_CELL = """\
batch = await source.next_batch()   # looking around: not exported
len(batch.items)
"""

TRAIN_CELL = """\
# GRPO on the digits task
import torch
from transformers import AutoModelForCausalLM

from ludic_lab.distributed import ClientPublisher
from ludic_lab.training import Trainer, TrainerConfig
from ludic_lab.training.loggers import JSONLLogger

policy = AutoModelForCausalLM.from_pretrained(client.model_path, dtype=torch.float32)
# each rank samples its own rollouts (under torchrun): batch_split="per_rank"
config = TrainerConfig(lr=LR, max_seq_len=256, micro_token_budget=2048, seed=0, batch_split="per_rank")
trainer = Trainer(policy, algo, source, config=config, publisher=ClientPublisher(client),
                  loggers=[JSONLLogger(METRICS)], pad_token_id=client.pad_token_id)
history = await trainer.train(STEPS, progress=False)
trainer.close()
print(f"rank {trainer.rank}/{trainer.world_size} trained {len(history)} steps, "
      f"reward {history[-1]['reward_mean']:.3f}", flush=True)
"""


def _notebook(path: Path, cells: list[tuple[str, list[str]]]) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for src, tags in cells:
        c = nbformat.v4.new_code_cell(src)
        if tags:
            c.metadata["tags"] = tags
        nb.cells.append(c)
    nbformat.write(nb, str(path))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


# -- the training cell trains as a script ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.distributed
def test_exported_training_cell_trains_with_python_and_torchrun(tmp_path: Path, tiny_model_dir: str) -> None:
    nb = _notebook(
        tmp_path / "grpo.ipynb",
        [
            (PARAMS, []),
            (ENV_CELL, []),
            (ENGINE_CELL, []),
            (EXPLORE_CELL, []),
            ("%%ludic_export train.py\n" + TRAIN_CELL, []),
        ],
    )
    script = export_notebook(nb)
    assert script.path == tmp_path / "train.py"
    assert script.config_fields == ["model", "steps", "prompts", "group_size", "max_tokens", "lr", "metrics"]
    assert script.cells == ["cell 2", "cell 3"] and script.is_async
    assert any("LUDIC_SMOKE" in n for n in script.notes)  # the smoke override is left out, and said so
    src = script.path.read_text()
    assert "batch = await source.next_batch()" not in src  # the exploration cell is not exported
    assert "class DigitsEnv" in src.split("def _main_async")[0]  # definitions stay at module level
    # the engine cell computes with parameters: it runs in main, after the CLI is parsed
    assert "client = LocalChatClient(MODEL" in src.split("async def _main_async")[1]

    help_out = subprocess.run([PY, str(script.path), "--help"], capture_output=True, text=True, timeout=120)
    assert help_out.returncode == 0 and "--group-size" in help_out.stdout and "optimizer steps" in help_out.stdout

    # 1) plain python
    run1 = tmp_path / "py"
    run1.mkdir()
    p = subprocess.run(
        [PY, str(script.path), "--model", tiny_model_dir, "--steps", "3", "--metrics", "m.jsonl"],
        cwd=run1, capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0/1 trained 3 steps" in p.stdout
    rows = _rows(run1 / "m.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["items"] == 16 and isinstance(r["loss"], float) and r["policy_version"] == r["step"] for r in rows)

    # 2) torchrun, 2 ranks (gloo), through the notebook's bridge: the trainer shards with FSDP2
    #    (each rank trains on its own rollouts, gradients summed), only rank 0 writes metrics,
    #    and the bridge tails them into a live callback
    from ludic_lab.lab import launch_torchrun

    seen: list[int] = []
    m2 = tmp_path / "tr" / "m.jsonl"
    run = launch_torchrun(script, nproc=2, args=["--model", tiny_model_dir, "--steps", "2", "--metrics", m2],
                          env={"TOKENIZERS_PARALLELISM": "false"}, metrics_path=m2,
                          live=lambda step, m: seen.append(step), log_dir=tmp_path / "tr" / "logs")  # fmt: skip
    run.wait(timeout=400)
    assert "rank 0/2 trained 2 steps" in run.tail(0) and "rank 1/2 trained 2 steps" in run.tail(1)
    rows = _rows(m2)
    assert [r["step"] for r in rows] == [1, 2]  # one writer: no interleaved duplicate lines
    assert all(isinstance(r["loss"], float) and r["items"] >= 1 and r["policy_version"] == r["step"] for r in rows)
    assert seen == [1, 2] and [r["step"] for r in run.metrics()] == [1, 2]


# -- structure of the generated script --------------------------------------------------------
def test_script_structure_parameters_globals_and_await(tmp_path: Path) -> None:
    cells = [
        "#| parameters\n# how many\nn = 3\nscale = 0.5  # a factor\nname = 'x'\nflag = False\nsizes = [1, 2]\nckpt = None\n",
        "#| export\nimport math\n\ndef f(x):\n    return math.sqrt(x) * scale  # a parameter, read when called\n",
        "#| export\nimport asyncio\n\nasync def g():\n    await asyncio.sleep(0)\n    return 1\n\nz = await g()\n",
        "y = 5  # not exported, not needed\n",
    ]
    target = (
        'total = 0\nfor i in range(n):\n    total += f(i) + z\nmsg = """two\n  lines"""\nr = await g()\n'
        "def later():\n    return total  # a global, as in the notebook\n"
        "print(total, later(), name, flag, sizes, ckpt, repr(msg), r)\n"
    )
    s = export_cells(cells, target, tmp_path / "s.py")
    assert s.config_fields == ["n", "scale", "name", "flag", "sizes", "ckpt"]
    src = s.path.read_text()
    assert '    n: int = 3\n    """how many"""' in src and '    scale: float = 0.5\n    """a factor"""' in src
    assert "sizes: tuple[int, ...] = (1, 2)" in src and "ckpt: typing.Optional[str] = None" in src
    assert 'msg = """two\n  lines"""' in src  # a multi-line string is not re-indented
    assert os.access(s.path, os.X_OK)
    out = subprocess.run([PY, str(s.path), "--n", "4", "--sizes", "7", "8", "--flag", "true"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    total = sum(i**0.5 * 0.5 + 1 for i in range(4))
    msg = repr("two\n  lines")
    assert out.stdout.strip() == f"{total} {total} x True (7, 8) None {msg} 1"


def test_user_config_dataclass(tmp_path: Path) -> None:
    cells = [
        '#| export\nfrom dataclasses import dataclass\n\n@dataclass\nclass Config:\n    steps: int = 2\n    """Steps."""\n    tag: str = \'a\'\n',
        "config = Config(steps=5)  # the notebook's instance: main's argument replaces it\n",
    ]
    s = export_cells(cells, "print(config.steps * 10, config.tag)", tmp_path / "u.py")
    assert s.config_fields == ["steps", "tag"]
    out = subprocess.run([PY, str(s.path), "--steps", "4"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["40", "a"], out.stderr


def test_unexported_name_is_an_error_naming_it_and_its_cell(tmp_path: Path) -> None:
    cells = [
        "#| export\nimport math\n",
        "import numpy as np\nthreshold = 0.5\n",
        "#| export\ndef f():\n    return helper()\n",
    ]
    with pytest.raises(ExportError) as e:
        export_cells(cells, "print(math.pi, np.pi, threshold, f(), nowhere); display(1)", tmp_path / "x.py")
    msg = str(e.value)
    assert "np (used in the exported cell): defined in cell 2, which is not marked #| export" in msg
    assert "threshold (used in the exported cell): defined in cell 2" in msg
    assert "helper (used in cell 3): defined in no cell" in msg
    assert "nowhere" in msg and "display" in msg and "from IPython.display import display" in msg
    assert "math" not in msg.split(":", 1)[1].replace("math.pi", "")  # exported: fine
    assert not (tmp_path / "x.py").exists()  # nothing written


@pytest.mark.parametrize(
    "cell, fragment",
    [
        ("#| export\n%pip install foo\nx = 1\n", "line 1: '%pip install foo'"),
        ("#| export\nfiles = !ls\n", "line 1: 'files = !ls'"),
        ("#| export\nimport os\n%time os.getcwd()\n", "line 2: '%time os.getcwd()'"),
    ],
)
def test_magics_in_exported_cells_are_errors(tmp_path: Path, cell: str, fragment: str) -> None:
    with pytest.raises(ExportError, match="IPython magics or shell commands") as e:
        export_cells([cell], "print(1)", tmp_path / "m.py")
    assert fragment in str(e.value)


def test_bad_parameters_and_clashes(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"cannot tell the type of steps = compute\(\): annotate it"):
        build_script([_cell("#| parameters\nsteps = compute()\n")], _cell("print(steps)"))
    with pytest.raises(ExportError, match="only `name = value` assignments"):
        build_script([_cell("#| parameters\na, b = 1, 2\n")], _cell("print(a)"))
    with pytest.raises(ExportError, match="defines main, a name the script needs"):
        build_script([_cell("#| export\ndef main():\n    pass\n")], _cell("main()"))
    with pytest.raises(ExportError, match="more than one parameters cell"):
        build_script([_cell("#| parameters\na = 1\n"), _cell("#| parameters\nb = 2\n")], _cell("print(a, b)"))
    # an annotated expression is fine (and its names must be exported)
    src = build_script(
        [_cell("#| export\nimport os\n"), _cell("#| parameters\nout: str = os.getcwd()\n")], _cell("print(out)")
    )
    assert "out: str = os.getcwd()" in src
    # an existing file not written by the export is never overwritten
    (tmp_path / "mine.py").write_text("print('precious')\n")
    with pytest.raises(ExportError, match="not overwriting"):
        export_cells([], "print(1)", tmp_path / "mine.py")
    assert (tmp_path / "mine.py").read_text() == "print('precious')\n"
    export_cells([], "print(1)", tmp_path / "mine.py", force=True)


def test_free_names_scoping() -> None:
    src = (
        "import os\nfrom x import y as z\na = 1\n"
        "def f(q):\n    global g\n    g = 2\n    return q + a + u1 + [w for w in u2]\n"
        "class C:\n    k = u3\n    def m(self):\n        return k_free\n"
        "def main():\n    global b\n    b = lambda: b + u4\n"
    )
    assert free_names(src) == {"u1", "u2", "u3", "k_free", "u4"}


def _cell(src: str, label: str = "cell") -> object:
    from ludic_lab.lab.export import Cell

    return Cell(src, label)


# -- the magic in a real kernel -----------------------------------------------------------------
@pytest.mark.notebook
def test_magic_in_a_real_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    # as under Jupyter Server: the kernel knows its notebook, whose saved cell tags mark the parameters cell
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "k.ipynb"))
    cells = [
        ("from ludic_lab import lab   # registers %%ludic_export", []),
        ("N = 3  # how many\n", ["parameters"]),
        ("#| export\ndef square(x):\n    return x * x\n", []),
        ("offset = 100   # defined here, not exported", []),
        ("#| export\ndef square(x):\n    return x * x * 1  # re-run, edited\n", []),
        ("%%ludic_export ok.py\nvalues = [square(i) for i in range(N)]\nprint(sum(values))\n", []),
        ("%%ludic_export bad.py\nprint(square(N) + offset)\n", ["raises-exception"]),
        ("%%ludic_export magic.py\n%time square(2)\n", ["raises-exception"]),
    ]
    nb_path = _notebook(tmp_path / "k.ipynb", cells)
    nb = nbformat.read(str(nb_path), as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    out_ok = nb.cells[5].outputs
    assert any("ok.py" in o.get("data", {}).get("text/html", "") for o in out_ok), out_ok
    p = subprocess.run([PY, str(tmp_path / "ok.py"), "--n", "4"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "14", p.stderr
    src = (tmp_path / "ok.py").read_text()
    assert '    n: int = 3\n    """how many"""' in src
    assert src.count("def square") == 2  # both versions ran in the kernel (no cell ids from nbclient)
    err = "".join(o.get("evalue", "") + "".join(o.get("traceback", [])) for o in nb.cells[6].outputs)
    assert "offset (used in In[7]): defined in In[4], which is not marked #| export" in err, err
    assert not (tmp_path / "bad.py").exists()
    err2 = "".join(o.get("evalue", "") + "".join(o.get("traceback", [])) for o in nb.cells[7].outputs)
    assert "IPython magics or shell commands" in err2 and "%time square(2)" in err2


def test_command_line_export(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from ludic_lab.lab.export import main

    nb = _notebook(tmp_path / "n.ipynb", [("x = 2", ["parameters"]), ("%%ludic_export out.py\nprint(x * 21)\n", [])])
    assert main([str(nb)]) == 0 and "wrote" in capsys.readouterr().out
    p = subprocess.run([PY, str(tmp_path / "out.py"), "--x", "1"], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "21", p.stderr
    assert main([str(nb), "--cell", "1"]) == 1  # the parameters cell has no %%ludic_export line and no -o
    assert "has no %%ludic_export line" in capsys.readouterr().err


def test_command_line_export_reads_notebooks_with_nbformat(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ludic_lab.cli import main

    nb = _notebook(tmp_path / "n.ipynb", [("x = 2", ["parameters"]), ("%%ludic_export out.py\nprint(x * 21)\n", [])])
    (tmp_path / "bad.ipynb").write_text("{not json", encoding="utf-8")
    assert main(["export", str(tmp_path / "bad.ipynb")]) == 1
    assert "cannot read notebook" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "nbformat", None)  # the notebook extra is not installed
    assert main(["export", str(nb)]) == 1
    assert "needs the 'notebook' extra" in capsys.readouterr().err and not (tmp_path / "out.py").exists()


def test_names_a_kernel_adds_to_builtins_are_still_undefined_in_the_script() -> None:
    """In a kernel IPython puts ``display`` and ``get_ipython`` into ``builtins``; the exported
    script runs without them, so a cell that calls them bare must still be reported."""
    from IPython.core.interactiveshell import InteractiveShell

    from ludic_lab.lab.export.syntax import free_names

    InteractiveShell.instance()  # what a kernel (or the lab's background tests) leaves behind
    import builtins

    assert hasattr(builtins, "display")
    assert free_names("display(1); get_ipython(); print(len([]))") == {"display", "get_ipython"}


def test_smoke_switch_of_the_parameters_cell_is_not_a_flag(tmp_path: Path) -> None:
    """``smoke`` switches the notebook's quick check; the script has no smoke cell, so no --smoke."""
    cells = ["#| parameters\nsteps = 3  # optimizer steps\nsmoke = False  # True: a quick check of every cell\n"]
    s = export_cells(cells, "print(steps)", tmp_path / "s.py")
    assert s.config_fields == ["steps"] and "smoke: bool" not in s.path.read_text()
    assert any("smoke switches the notebook only" in n for n in s.notes), s.notes
    with pytest.raises(ExportError, match="smoke"):
        export_cells(cells, "print(steps if not smoke else 1)", tmp_path / "t.py")
