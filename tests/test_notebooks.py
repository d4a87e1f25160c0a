"""The notebooks and tutorials: committed without outputs, built from their sources, and each
one executes headless, top to bottom, in its smoke configuration.

Smoke configuration: the first code cell of every notebook is its parameters cell (tagged
``parameters``, first line ``#| parameters``) holding the full configuration a user runs;
the next cell shrinks it (fewer steps, questions and tokens) when its last entry
``smoke = False`` is set true, or the environment variable ``LUDIC_SMOKE=1`` is set. The kernel used here is the interpreter running the tests
(``sys.executable``) with ``LUDIC_SMOKE=1`` in its environment, so the test needs no
registered kernel. Each notebook runs in its own temporary working directory, so exported
scripts and run folders never land in the repository; a tutorial must leave an exported
``runs/*/train.py`` whose check run logged an optimizer step. Wall and CPU time per notebook
are printed (``pytest -s``) and recorded as junit properties.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.xdist_groups import HEAVY_MEMORY

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {
    "notebooks": ("quickstart", "rollout_explorer", "server_weight_sync"),
    "tutorials": (
        "01_reinforce",
        "02_rloo",
        "03_grpo",
        "04_dr_grpo_dapo",
        "05_gspo",
        "06_cispo_scalerl",
        "07_sft_rejection_sampling",
        "08_tool_use",
        "09_code_exec",
        "10_bring_your_agent",
        "11_judges",
        "12_bring_your_env",
        "13_workspace_agent",
    ),
}
SIGNAL_CHECKED = {
    "01_reinforce", "02_rloo", "03_grpo", "04_dr_grpo_dapo", "05_gspo", "06_cispo_scalerl", "07_sft_rejection_sampling",
    "09_code_exec", "10_bring_your_agent", "11_judges",
}  # fmt: skip
"""Tutorials whose smoke run must show reward signal (:func:`_check_signal`). 10_bring_your_agent:
its credit-view batch and its training step's batch are 2 questions x 6 episodes each, seeded,
and the untrained openai-SDK agent answers about 1 in 3 right at temperature 1 (4 of 12 in the
credit-view batch, 7 of 20 held out), so all 24 equal is unlikely even where numerics differ.
11_judges: its judge scores a reply by the probability of "yes" (a float), so two different
replies of a group practically never score alike."""
EXTENDED = {"01_reinforce", "02_rloo", "04_dr_grpo_dapo", "05_gspo", "06_cispo_scalerl", "07_sft_rejection_sampling",
            "08_tool_use", "09_code_exec", "10_bring_your_agent", "11_judges", "12_bring_your_env"}  # fmt: skip
"""Tutorials whose smoke run is ``extended`` (``make test-all``, which CI runs; not ``make test``): 01-06 are
03_grpo's notebook with another preset (the presets and losses have their own tests; 03 runs in CI),
07's rejection sampling + SFT is ``examples/rejection_sampling.py``'s (tests/test_examples.py),
08's GRPO over ``ToolAgent`` episodes is README's tool block's (tests/test_readme.py) and
tests/test_tool_*.py's, 09's sandboxed code env is ``tests/test_code_exec_*.py``'s, 10's openai-SDK
agent trained through the endpoint is docs/agents_from_outside.md's (tests/test_docs_snippets.py)
and tests/test_endpoint_*.py's, 11's rubric judge rewarding a GRPO run is
``examples/explain_task.py``'s (tests/test_examples.py) and tests/test_judge*.py's, 12's verifiers
and OpenEnv environments are their examples' (tests/test_examples.py) and tests/test_verifiers*.py's.
Their static checks (no outputs, the parameters cell, the prose) run in ``make test``."""
NEEDS_VLLM = {"server_weight_sync"}
"""Notebooks that start a vLLM server (also marked ``vllm``)."""
NEEDS_PACKAGES = {"12_bring_your_env": ("verifiers", "openenv")}
"""Notebooks that need an optional extra's packages (``verifiers``, ``openenv``): skipped without them."""
SMOKE_ENV = "LUDIC_SMOKE"
CELL_TIMEOUT_S = 600
KERNEL_NAME = "ludic-lab-smoke"


def _all_notebooks() -> list[Path]:
    return [ROOT / folder / f"{name}.ipynb" for folder, names in EXPECTED.items() for name in names]


class _Node(dict):
    """Attribute access over a notebook's JSON, as ``nbformat.NotebookNode`` gives (the policy
    checks below need no Jupyter package)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"), object_hook=_Node)


def _src(cell: Any) -> str:
    """A cell's source as one string (the file stores it as a list of lines)."""
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- policy: what is committed ---------------------------------------------------------------


def test_every_expected_notebook_is_committed_and_nothing_else() -> None:
    found = {p for folder in EXPECTED for p in (ROOT / folder).glob("*.ipynb")}
    assert found == set(_all_notebooks()), (
        f"missing: {sorted(map(str, set(_all_notebooks()) - found))}; "
        f"unexpected (add to EXPECTED in this test): {sorted(map(str, found - set(_all_notebooks())))}"
    )


@pytest.mark.parametrize("path", _all_notebooks(), ids=lambda p: p.stem)
def test_committed_without_outputs(path: Path) -> None:
    """Notebooks are committed without outputs: run ``python scripts/strip_notebooks.py``."""
    nb = _read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    dirty = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
    ]
    assert not dirty, f"{path.name}: code cells {dirty} hold outputs; run python scripts/strip_notebooks.py"
    assert "widgets" not in nb.metadata, f"{path.name} holds saved widget state; run python scripts/strip_notebooks.py"


@pytest.mark.parametrize("path", _all_notebooks(), ids=lambda p: p.stem)
def test_parameters_cell_then_smoke_switch(path: Path) -> None:
    """The first code cell is the parameters cell (papermill tag and ``#| parameters``),
    holding only ``name = <literal>`` lines (the full configuration, each a flag of an
    exported script) ending with ``smoke = False``; the next code cell shrinks the run when
    ``smoke`` is true or ``$LUDIC_SMOKE`` is set (a user switches it in the notebook)."""
    nb = _read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters', need exactly 1"
    params = tagged[0]
    assert code[0] is params, f"{path.name}: the parameters cell must be the first code cell"
    assert _src(params).lstrip().startswith("#| parameters"), (
        f"{path.name}: start the parameters cell with '#| parameters'"
    )
    for node in ast.parse(_src(params)).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name), (
            f"{path.name}: the parameters cell holds only `name = value` lines, found {ast.unparse(node)!r}"
        )
        ast.literal_eval(node.value)  # a literal: the value a user (or papermill) sets
    last = ast.parse(_src(params)).body[-1]
    assert ast.unparse(last) == "smoke = False", f"{path.name}: end the parameters cell with `smoke = False`"
    switch = ast.parse(_src(code[1]))
    reads = {n.id for n in ast.walk(switch) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert "smoke" in reads and SMOKE_ENV in _src(code[1]), (
        f"{path.name}: the cell after the parameters cell must honour `smoke` and ${SMOKE_ENV}"
    )


@pytest.mark.parametrize("path", [p for p in _all_notebooks() if p.parent.name == "tutorials"], ids=lambda p: p.stem)
def test_prose_about_a_run_of_this_notebook_agrees_with_its_cells(path: Path) -> None:
    """A sentence of prose about a run of this notebook (or its full configuration) says the number of steps its parameters
    cell sets, and quotes no measured figure (a decimal such as 0.35): the numbers of a run come
    from the cells that print them, not from the text."""
    nb = _read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(_src(code[0])).body}
    for cell in (c for c in nb.cells if c.cell_type == "markdown"):
        text = " ".join(_src(cell).split())
        for sentence in re.split(r"(?<=[.!?])\s+", text):
            if "this notebook" not in sentence and "full configuration" not in sentence:
                continue
            for m in re.finditer(r"\b(\d+) (?:optimizer )?steps\b", sentence):
                assert int(m.group(1)) == params.get("steps"), (
                    f"{path.name}: the prose says {m.group(0)!r} of a run of this notebook; its parameters cell "
                    f"sets steps = {params.get('steps')}: {sentence!r}"
                )
            figures = re.findall(r"\b\d\.\d{2}\b", sentence)
            assert not figures, (
                f"{path.name}: the prose quotes {figures} of a run of this notebook; print them from a cell "
                f"instead: {sentence!r}"
            )


@pytest.mark.notebook
def test_notebooks_are_built_from_their_sources() -> None:
    pytest.importorskip("nbformat")
    problems = _load_script("build_notebooks").check()
    assert not problems, "\n".join(problems)


@pytest.mark.notebook
def test_strip_script_strips_and_check_detects(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")

    strip = _load_script("strip_notebooks")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(
        "1 + 1",
        metadata={
            "tags": ["parameters"],
            "execution": {"iopub.execute_input": "2024-01-01T00:00:00.000Z"},
            "scrolled": True,
        },
    )
    cell.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=3)]
    cell.execution_count = 3
    nb.cells.append(cell)
    nb.metadata["widgets"] = {"state": {}}
    path = tmp_path / "dirty.ipynb"
    nbformat.write(nb, path)
    assert strip.main(["--check", str(path)]) == 1
    assert strip.main([str(path)]) == 0
    clean = nbformat.read(path, as_version=4)
    assert clean.cells[0].outputs == [] and clean.cells[0].execution_count is None
    assert clean.cells[0].metadata == {"tags": ["parameters"]}
    assert "widgets" not in clean.metadata
    assert strip.main(["--check", str(path)]) == 0


@pytest.mark.notebook
def test_myst_round_trip() -> None:
    pytest.importorskip("nbformat")
    build = _load_script("build_notebooks")
    src = (
        "# Title\n\nSome $x^2$ prose.\n\n```{code-cell} ipython3\n:tags: [parameters]\n\nA = 1\n```\n\n"
        "+++\n\nMore.\n\n```{code-cell} ipython3\nprint(A)\n```\n"
    )
    nb = build.build_notebook(build.parse_myst(src))
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "markdown", "code"]
    assert nb.cells[1].metadata["tags"] == ["parameters"] and nb.cells[1].source == "A = 1"
    again = build.build_notebook(build.parse_myst(build.notebook_to_myst(nb)))
    assert [(c.cell_type, c.source, c.metadata) for c in again.cells] == [
        (c.cell_type, c.source, c.metadata) for c in nb.cells
    ]


# -- execution in the smoke configuration ----------------------------------------------------


@pytest.fixture(scope="session")
def smoke_kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernelspec folder whose kernel is this interpreter, with ``LUDIC_SMOKE=1``."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL_NAME
    spec.mkdir()
    env = {SMOKE_ENV: "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "ludic_lab smoke",
                "language": "python",
                "env": env,
            }
        )
    )
    return root


SIGNAL_PROBE = """\
import json as _json
from ludic_lab.rollouts.saw import SAWBatch as _SAWBatch

def _ludic_signal_probe():
    def _batch(b):
        groups = {}
        for it in b.items:
            groups.setdefault(it.group_id, []).append(float(it.reward))
        return {"rewards": [float(it.reward) for it in b.items], "groups": list(groups.values()),
                "weighted_items": sum(any(w != 0 for w in it.weights) for it in b.items)}
    def _is_history(v):
        return (
            isinstance(v, list)
            and bool(v)
            and all(isinstance(h, dict) for h in v)
            and any("source/reward_std" in h for h in v)
        )
    out = {"batches": {}, "histories": {}, "kept": None}
    for name, v in list(globals().items()):
        if name.startswith("_"):
            continue
        if isinstance(v, _SAWBatch):
            out["batches"][name] = _batch(v)
        elif _is_history(v):
            out["histories"][name] = [h.get("source/reward_std") for h in v]
        elif isinstance(v, dict) and v and all(_is_history(h) for h in v.values()):
            out["histories"].update({f"{name}[{k}]": [h.get("source/reward_std") for h in h_] for k, h_ in v.items()})
    if isinstance(globals().get("kept"), list):
        out["kept"] = len(globals()["kept"])
    print("LUDIC_SIGNAL " + _json.dumps(out))

_ludic_signal_probe()
"""
"""Appended (by the test, never committed) as a last cell of every tutorial: prints the reward
signal the run saw — each SAWBatch in the namespace (rewards per group, how many items carry a
non-zero weight), each trainer history's per-step batch reward std, rejection sampling's kept
count — for :func:`_check_signal`."""


def _execute(path: Path, kernel_dir: Path, workdir: Path, *, probe: bool = False) -> tuple[Any, float]:
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    if probe:
        nb.cells.append(nbformat.v4.new_code_cell(SIGNAL_PROBE, metadata={"tags": ["signal-probe"]}))
    km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        resources={"metadata": {"path": str(workdir)}},
        record_timing=True,
    )
    t0 = time.perf_counter()
    try:
        client.execute()
    finally:
        if km.has_kernel:  # nbclient leaves a kernel it did not create running
            km.shutdown_kernel(now=False)
        nbformat.write(nb, workdir / f"{path.stem}.executed.ipynb")  # kept for post-mortems
    return nb, time.perf_counter() - t0


def _children_cpu_s() -> float:
    """CPU seconds of every reaped child process (kernels and what they started) so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _stderr_tracebacks(nb: Any) -> list[str]:
    """Tracebacks printed to stderr by cells that did not raise (e.g. from a background task)."""
    bad = []
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if (
                o.get("output_type") == "stream"
                and o.get("name") == "stderr"
                and "Traceback (most recent call last)" in o.get("text", "")
            ):
                bad.append(f"cell {i}: {o['text'][-2000:]}")
    return bad


def _marks(path: Path) -> list[Any]:
    marks = [pytest.mark.notebook, pytest.mark.slow, pytest.mark.timeout(1500), HEAVY_MEMORY]  # one at a time
    if path.stem in EXTENDED:
        marks.append(pytest.mark.extended)
    if path.stem in NEEDS_VLLM:
        marks.append(pytest.mark.vllm)
    return marks


@pytest.mark.parametrize("path", [pytest.param(p, marks=_marks(p), id=p.stem) for p in _all_notebooks()])
def test_notebook_executes_in_smoke_configuration(
    path: Path, smoke_kernel_dir: Path, tmp_path: Path, record_property: Any
) -> None:
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    if path.stem in NEEDS_VLLM:
        pytest.importorskip("vllm")
    for package in NEEDS_PACKAGES.get(path.stem, ()):
        pytest.importorskip(package, reason=f"{path.name} needs the {package} extra")
    cpu0 = _children_cpu_s()
    nb, wall_s = _execute(path, smoke_kernel_dir, tmp_path, probe=path.stem in SIGNAL_CHECKED)
    cpu_s = _children_cpu_s() - cpu0  # less sensitive than wall time to whatever else the machine runs
    record_property("wall_s", round(wall_s, 1))
    record_property("cpu_s", round(cpu_s, 1))
    print(f"\n[notebook] {path.relative_to(ROOT)}: {wall_s:.1f} s wall, {cpu_s:.1f} s CPU")
    assert not _stderr_tracebacks(nb), "\n".join(_stderr_tracebacks(nb))
    ran = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in ran), "some code cells did not run"
    assert not any(o.get("output_type") == "error" for c in ran for o in c.outputs)
    if path.parent.name == "tutorials":
        _check_exported_run(tmp_path)
    if path.stem in SIGNAL_CHECKED:
        _check_signal(path.stem, nb)


def _check_exported_run(workdir: Path) -> None:
    """A tutorial exported its training cell and the script trained: the script is there and
    its metrics file holds at least one optimizer step with a finite loss."""
    scripts = sorted(workdir.glob("runs/*/train.py"))
    assert scripts, f"no exported script under {workdir}/runs/*/train.py"
    assert "ludic_export" in scripts[0].read_text(), f"{scripts[0]} was not written by %%ludic_export"
    rows = [
        json.loads(ln) for p in workdir.glob("runs/*/metrics.jsonl") for ln in p.read_text().splitlines() if ln.strip()
    ]
    steps = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    assert steps, f"the exported script logged no optimizer step (metrics rows: {rows[:3]})"


def _signal(nb: Any) -> dict[str, Any]:
    """What the appended :data:`SIGNAL_PROBE` cell printed."""
    for o in nb.cells[-1].get("outputs", []):
        for line in o.get("text", "").splitlines():
            if line.startswith("LUDIC_SIGNAL "):
                return json.loads(line[len("LUDIC_SIGNAL ") :])
    raise AssertionError(f"the signal probe printed nothing: {nb.cells[-1].get('outputs')}")


def _check_signal(stem: str, nb: Any) -> None:
    """The smoke run still shows what the tutorial teaches: the rewards it trained on were not
    all equal. For GRPO, the batch drawn in the credit view holds a group whose rewards differ
    (so some tokens carry a non-zero weight, not an all-white view); for the others some batch
    or training step had reward variance; rejection sampling kept at least one sample."""
    sig = _signal(nb)
    print(f"[signal] {stem}: {json.dumps(sig)}")
    if stem.startswith("07_"):
        assert sig["kept"], (
            f"{stem}: rejection sampling kept no sample in the smoke run: nothing to fine-tune on ({sig})"
        )
        return
    varied_groups = {n: [g for g in b["groups"] if len(set(g)) > 1] for n, b in sig["batches"].items()}
    if stem == "03_grpo":
        b = sig["batches"].get("batch")
        assert b is not None, f"03_grpo: no `batch` in the namespace ({sorted(sig['batches'])})"
        assert varied_groups["batch"] and b["weighted_items"] > 0, (
            f"03_grpo smoke run: every group of the credit-view batch has equal rewards ({b['groups']}), "
            "so every token weight is 0 and the credit view is all white"
        )
        return
    in_batches = any(len(set(b["rewards"])) > 1 for b in sig["batches"].values())
    in_steps = any(isinstance(x, (int, float)) and x > 0 for h in sig["histories"].values() for x in h)
    assert in_batches or in_steps, f"{stem} smoke run: every reward it saw was equal, no signal to learn from ({sig})"
