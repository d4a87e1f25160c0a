"""Tests of ChatTemplate: rendering, stop tokens and token-exact conversation extension."""

from __future__ import annotations

import copy

import pytest

from ludic_lab.inference.chat_template import ChatTemplate

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@pytest.fixture(scope="module")
def ct(tiny_tokenizer) -> ChatTemplate:
    return ChatTemplate(tiny_tokenizer)


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_stop_token_ids_are_eos_and_im_end(tiny_tokenizer, ct):
    im_end = tiny_tokenizer.convert_tokens_to_ids(IM_END)
    assert ct.stop_token_ids == frozenset({im_end, tiny_tokenizer.eos_token_id})
    extra = ChatTemplate(tiny_tokenizer, stop_token_ids=[0])
    assert extra.stop_token_ids == frozenset({0, im_end})


def test_generation_eos_ids_from_a_folder_a_config_or_a_model(tmp_path):
    import json

    from transformers import GenerationConfig

    from ludic_lab.inference.chat_template import generation_eos_ids

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert generation_eos_ids(tmp_path) == [2, 0]
    assert generation_eos_ids(str(tmp_path)) == [2, 0]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert generation_eos_ids(tmp_path) == [7]
    assert generation_eos_ids(tmp_path / "missing") == []  # no generation config: nothing extra
    (tmp_path / "generation_config.json").write_text("{not json")
    assert generation_eos_ids(tmp_path) == []
    assert generation_eos_ids(GenerationConfig(eos_token_id=[5, 6])) == [5, 6]

    class Model:
        generation_config = GenerationConfig(eos_token_id=3)

    assert generation_eos_ids(Model()) == [3]
    assert generation_eos_ids(GenerationConfig()) == []


def test_tokenizer_without_chat_template_is_a_clear_error(tiny_tokenizer):
    bare = copy.deepcopy(tiny_tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        ChatTemplate(bare)


def test_render_ids_is_the_template_text_tokenized_without_extra_specials(tiny_tokenizer, ct):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text = ct.render_text(msgs)
    assert text == f"{IM_START}system\nBe brief.{IM_END}\n{IM_START}user\n2+2?{IM_END}\n{IM_START}assistant\n"
    ids = ct.render_ids(msgs)
    assert ids == enc(tiny_tokenizer, text)
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids(IM_START)  # nothing prepended
    assert ids.count(tiny_tokenizer.convert_tokens_to_ids(IM_END)) == 2  # specials are single ids
    assert ct.render_ids(msgs, add_generation_prompt=False) == enc(
        tiny_tokenizer, text[: -len(f"{IM_START}assistant\n")]
    )


def test_decode_skips_special_tokens(tiny_tokenizer, ct):
    ids = enc(tiny_tokenizer, "Hello <b>there</b>") + [tiny_tokenizer.convert_tokens_to_ids(IM_END)]
    assert ct.decode(ids) == "Hello <b>there</b>"


CONVERSATIONS = [
    # (history, assistant reply, new messages)
    ([{"role": "user", "content": "Play."}], "My move: 5", [{"role": "user", "content": "Next."}]),
    (
        [{"role": "system", "content": "You play tic-tac-toe."}, {"role": "user", "content": "Board: . . ."}],
        "<think>centre</think> <move>5</move>",
        [{"role": "user", "content": "Board: . X .\nYour turn."}],
    ),
    (
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        "Über 3 + 4 = 7 🎉",
        [{"role": "tool", "content": "42"}, {"role": "user", "content": "and now?"}],
    ),
    ([{"role": "user", "content": "x"}], "", [{"role": "user", "content": "empty reply?"}]),
]


@pytest.mark.parametrize("history,reply,new", CONVERSATIONS)
@pytest.mark.parametrize("ended_with_stop", [True, False])
def test_extended_prompt_equals_fresh_render(tiny_tokenizer, ct, history, reply, new, ended_with_stop):
    im_end = tiny_tokenizer.convert_tokens_to_ids(IM_END)
    prompt = ct.render_ids(history)
    completion = enc(tiny_tokenizer, reply) + ([im_end] if ended_with_stop else [])
    cont = ct.continuation_ids(history, new, completion_ended_with_stop=ended_with_stop)
    fresh = ct.render_ids([*history, {"role": "assistant", "content": reply}, *new])
    assert prompt + completion + cont == fresh
    # the end-of-turn token is added exactly when the completion did not sample it
    assert (cont[0] == im_end) is (not ended_with_stop)
    assert ct.tokenizer.decode(cont).endswith(f"{IM_START}assistant\n")


def test_extension_chains_over_many_turns(tiny_tokenizer, ct):
    im_end = tiny_tokenizer.convert_tokens_to_ids(IM_END)
    msgs = [{"role": "system", "content": "Count."}, {"role": "user", "content": "1"}]
    ids = ct.render_ids(msgs)
    for turn in range(4):
        reply = f"{turn + 2} and then"
        cut = turn % 2 == 1  # alternate: completion ended with <|im_end|> / was cut at max_tokens
        completion = enc(tiny_tokenizer, reply) + ([] if cut else [im_end])
        new = [{"role": "user", "content": f"ok {turn}"}]
        ids = ids + completion + ct.continuation_ids(msgs, new, completion_ended_with_stop=not cut)
        msgs = [*msgs, {"role": "assistant", "content": reply}, *new]
        assert ids == ct.render_ids(msgs)


def test_extension_with_tools_equals_fresh_render(tiny_tokenizer, ct):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    history = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "1+2?"}]
    prompt = ct.render_ids(history, tools=tools)
    assert "# Tools" in tiny_tokenizer.decode(prompt) and '"name": "add"' in tiny_tokenizer.decode(prompt)
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    completion = enc(tiny_tokenizer, reply) + [tiny_tokenizer.convert_tokens_to_ids(IM_END)]
    new = [{"role": "tool", "content": "3"}]
    cont = ct.continuation_ids(history, new, completion_ended_with_stop=True, tools=tools)
    fresh = ct.render_ids([*history, {"role": "assistant", "content": reply}, *new], tools=tools)
    assert prompt + completion + cont == fresh


def test_sampled_ids_are_kept_even_when_tokenization_boundaries_differ(tiny_tokenizer, ct):
    # a sampler may produce a non-canonical split (here: byte by byte); the extended prompt
    # keeps those ids (what the model saw) and differs from a re-render only in token ids
    history = [{"role": "user", "content": "hi"}]
    reply = "hello world"
    canonical = enc(tiny_tokenizer, reply)
    per_char = [i for ch in reply for i in enc(tiny_tokenizer, ch)]
    assert per_char != canonical
    im_end = tiny_tokenizer.convert_tokens_to_ids(IM_END)
    new = [{"role": "user", "content": "again"}]
    prompt = ct.render_ids(history)
    extended = prompt + per_char + [im_end] + ct.continuation_ids(history, new, completion_ended_with_stop=True)
    fresh = ct.render_ids([*history, {"role": "assistant", "content": reply}, *new])
    assert extended != fresh
    assert extended[len(prompt) : len(prompt) + len(per_char)] == per_char
    assert tiny_tokenizer.decode(extended) == tiny_tokenizer.decode(fresh)


def test_template_that_drops_assistant_content_is_refused(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with pytest.raises(ValueError, match="dropped the assistant content"):
        ChatTemplate(tok).continuation_ids(
            [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}], completion_ended_with_stop=True
        )


@pytest.mark.slow
def test_smollm2_template_extension_equals_fresh_render(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    ct = ChatTemplate(tok)
    assert tok.convert_tokens_to_ids(IM_END) in ct.stop_token_ids
    histories = (
        [{"role": "user", "content": "Play."}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Go"}],
    )
    for history in histories:
        for ended in (True, False):
            reply = "I pick 5, the centre."
            completion = enc(tok, reply) + ([tok.convert_tokens_to_ids(IM_END)] if ended else [])
            new = [{"role": "user", "content": "Next move?"}]
            cont = ct.continuation_ids(history, new, completion_ended_with_stop=ended)
            fresh = ct.render_ids([*history, {"role": "assistant", "content": reply}, *new])
            assert ct.render_ids(history) + completion + cont == fresh
