"""The tiny test model: Qwen2-style, random weights, a byte-level BPE trained on generated text.

:func:`build_tiny_model` writes such a folder (~0.7M params) in about a second;
:func:`tiny_model_path` caches the default one. torch / transformers / tokenizers are
imported inside functions only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ludic_lab.inference.models.cache import PathLike, cache_root, materialize, normalize_tokenizer_config

TINY_MODEL_NAME = "tiny-qwen2-v1"
"""Folder name of the cached tiny model (bump the suffix when the builder changes)."""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens of the tiny tokenizer, ids 0, 1, 2 (the same layout as SmolLM2)."""

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures, one JSON object per line:\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}"
    "{{- '</tools>\\n\\nTo call a function, reply with <tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
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
        return (
            f"How many {rng.choice(_NOUNS)}s does {rng.choice(_NAMES)} have? "
            f"{rng.choice(_NAMES)} {rng.choice(_VERBS)} a {rng.choice(_ADJS)} {rng.choice(_NOUNS)}!"
        )
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
        parts.append(f'<|im_start|>tool\n{{"result": {rng.randint(0, 999)}}}<|im_end|>')
    parts.append(f"<|im_start|>assistant\n{_english(rng)}<|im_end|><|endoftext|>")
    return "\n".join(parts)


def _code(rng: random.Random) -> str:
    name, arg = rng.choice(_VERBS).rstrip("s"), rng.choice(_NOUNS)
    return (
        f"def {name}_{arg}({arg}: int) -> int:\n"
        f'    """Return the {rng.choice(_ADJS)} {arg}."""\n'
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
    intermediate_size: int | None = None,
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
        rope_theta=10000.0,  # type: ignore[call-arg]  # transformers 5 takes it through **kwargs (rope_parameters)
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers wraps .to, hiding its signature
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"]
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    normalize_tokenizer_config(out, model_max_length=max_position_embeddings)
    return str(out)


def tiny_model_path(cache_dir: PathLike | None = None) -> str:
    """Local folder of the default tiny model (:func:`build_tiny_model` defaults, seed 0), cached.

    Built once into ``<cache root>/models/tiny-qwen2-v1`` (about a second); safe to call
    concurrently from several processes.
    """
    dest = cache_root(cache_dir) / "models" / TINY_MODEL_NAME
    return materialize(dest, build_tiny_model, {"name": TINY_MODEL_NAME, "builder": "build_tiny_model"})
