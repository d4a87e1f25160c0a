"""Rollout requests (layer 5): pure-data descriptions of the episodes to run.

A :class:`RolloutRequest` names an environment and a protocol by registry ``kind`` (with
JSON kwargs), the seeds, the inference spec and a group id. It holds no live objects, so a
curriculum is just a list of requests and a request travels as JSON (``to_dict`` /
``from_dict``). The :class:`~ludic_lab.rollouts.engine.RolloutEngine` turns them
into :class:`~ludic_lab.types.Rollout` s.

Seeds of the episodes of one request (:meth:`RolloutRequest.episode_seeds`): episode ``e``
gets ``env_seed + e`` (distinct problems) unless the episodes share the env seed — when
``share_env_seed=True`` or, by default, when the request has a group id (a group is the same
prompt sampled several times) — and always ``sampling_seed + e`` (distinct samples). A
``None`` seed stays ``None`` (the env / backend picks one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import KW_ONLY, asdict, dataclass, field, fields
from typing import Any

from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig, ToolRequest


def _check_kind(owner: str, kind: Any) -> None:
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{owner}.kind must be a non-empty string (a registry key), got {kind!r}")


def _check_kwargs(owner: str, kwargs: Any) -> dict[str, Any]:
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"{owner}.kwargs must be a mapping of constructor kwargs, got {type(kwargs).__name__}")
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise TypeError(f"{owner}.kwargs keys must be strings, got {bad!r}")
    return dict(kwargs)


@dataclass(frozen=True)
class EnvSpec:
    """Which environment to build: ``env_registry[kind](**kwargs)``.

    ``kwargs`` should be JSON-serialisable so the request can travel (Redis, files).
    """

    kind: str
    """Key into the engine's env registry."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env factory."""

    def __post_init__(self) -> None:
        _check_kind("EnvSpec", self.kind)
        object.__setattr__(self, "kwargs", _check_kwargs("EnvSpec", self.kwargs))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvSpec:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class ProtocolSpec:
    """Which interaction protocol to build: ``protocol_registry[kind](**kwargs)``.

    The factory usually closes over live objects (the agent's client); ``kwargs`` are the
    JSON-able knobs on top.
    """

    kind: str
    """Key into the engine's protocol registry."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the protocol factory."""

    def __post_init__(self) -> None:
        _check_kind("ProtocolSpec", self.kind)
        object.__setattr__(self, "kwargs", _check_kwargs("ProtocolSpec", self.kwargs))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProtocolSpec:
        return cls(**_known(cls, d))


def _check_seed(name: str, v: Any) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"RolloutRequest.{name} must be an int or None, got {v!r}")
    if v < 0:
        raise ValueError(f"RolloutRequest.{name} must be >= 0 (numpy and vLLM reject negative seeds), got {v}")


@dataclass(frozen=True)
class RolloutRequest:
    """Template for ``num_episodes`` episodes of one env/protocol pair (pure data).

    The group id may be given as ``group_id=`` or, as in the reference, ``meta={"group_id":
    ...}`` (non-strings are converted with ``str``); after construction ``group_id`` holds
    the effective value. See the module docstring for how episode seeds are derived.
    """

    env: EnvSpec
    protocol: ProtocolSpec
    _: KW_ONLY
    num_episodes: int = 1
    """How many episodes to run (each with a fresh env and protocol)."""
    env_seed: int | None = None
    """Seed for ``env.reset`` (``None``: the env chooses)."""
    sampling_seed: int | None = None
    """Base seed for the agent's sampling (``None``: the backend chooses)."""
    inference: InferenceSpec | None = None
    """Passed to ``protocol.run(inference=...)`` (``None``: the agent's defaults)."""
    group_id: str | None = None
    """Rollouts sharing a group id are siblings (same prompt, different samples: GRPO)."""
    max_steps: int | None = None
    """Turn limit for these episodes; overrides the engine call's ``max_steps``."""
    share_env_seed: bool | None = None
    """All episodes use ``env_seed`` unchanged; ``None`` means "yes iff ``group_id`` is set"."""
    meta: dict[str, Any] = field(default_factory=dict)
    """JSON metadata copied into every resulting ``Rollout.meta``."""

    def __post_init__(self) -> None:
        if not isinstance(self.env, EnvSpec):
            raise TypeError(
                f"RolloutRequest.env must be an EnvSpec (e.g. EnvSpec('qa')), got {type(self.env).__name__}"
            )
        if not isinstance(self.protocol, ProtocolSpec):
            raise TypeError(
                f"RolloutRequest.protocol must be a ProtocolSpec (e.g. ProtocolSpec('single_agent')), "
                f"got {type(self.protocol).__name__}"
            )
        if isinstance(self.num_episodes, bool) or not isinstance(self.num_episodes, int) or self.num_episodes < 1:
            raise ValueError(f"RolloutRequest.num_episodes must be an int >= 1, got {self.num_episodes!r}")
        _check_seed("env_seed", self.env_seed)
        _check_seed("sampling_seed", self.sampling_seed)
        if self.inference is not None and not isinstance(self.inference, InferenceSpec):
            raise TypeError(
                f"RolloutRequest.inference must be an InferenceSpec or None, got {type(self.inference).__name__}"
            )
        if self.max_steps is not None and (
            isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1
        ):
            raise ValueError(f"RolloutRequest.max_steps must be an int >= 1 or None, got {self.max_steps!r}")
        if self.share_env_seed is not None and not isinstance(self.share_env_seed, bool):
            raise TypeError(f"RolloutRequest.share_env_seed must be a bool or None, got {self.share_env_seed!r}")
        if not isinstance(self.meta, Mapping):
            raise TypeError(f"RolloutRequest.meta must be a dict, got {type(self.meta).__name__}")
        meta = dict(self.meta)
        object.__setattr__(self, "meta", meta)
        gid = self.group_id
        if gid is not None and (not isinstance(gid, str) or not gid):
            raise ValueError(f"RolloutRequest.group_id must be a non-empty string or None, got {gid!r}")
        meta_gid = meta.get("group_id")
        if meta_gid is not None:
            meta_gid = str(meta_gid)
            if gid is not None and gid != meta_gid:
                raise ValueError(
                    f"RolloutRequest: group_id={gid!r} disagrees with meta['group_id']={meta_gid!r}; give one of them"
                )
            object.__setattr__(self, "group_id", meta_gid)

    # -- episodes -------------------------------------------------------------------
    @property
    def shares_env_seed(self) -> bool:
        """Whether all episodes of this request reset the env with the same seed."""
        return self.share_env_seed if self.share_env_seed is not None else self.group_id is not None

    def episode_seeds(self, episode_index: int) -> tuple[int | None, int | None]:
        """``(env_seed, sampling_seed)`` of episode ``episode_index`` (rule in the module docstring)."""
        if not 0 <= episode_index < self.num_episodes:
            raise IndexError(f"episode_index {episode_index} out of range for num_episodes={self.num_episodes}")
        env_seed = self.env_seed
        if env_seed is not None and not self.shares_env_seed:
            env_seed += episode_index
        sampling_seed = None if self.sampling_seed is None else self.sampling_seed + episode_index
        return env_seed, sampling_seed

    # -- serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` inverts it."""
        return {
            "env": self.env.to_dict(),
            "protocol": self.protocol.to_dict(),
            "num_episodes": self.num_episodes,
            "env_seed": self.env_seed,
            "sampling_seed": self.sampling_seed,
            "inference": None if self.inference is None else inference_spec_to_dict(self.inference),
            "group_id": self.group_id,
            "max_steps": self.max_steps,
            "share_env_seed": self.share_env_seed,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutRequest:
        """Rebuild a request from :meth:`to_dict` output; unknown keys are an error."""
        kw = _known(cls, d)
        if "env" not in kw or "protocol" not in kw:
            raise ValueError("RolloutRequest.from_dict needs 'env' and 'protocol'")
        kw["env"] = EnvSpec.from_dict(kw["env"])
        kw["protocol"] = ProtocolSpec.from_dict(kw["protocol"])
        if kw.get("inference") is not None:
            kw["inference"] = inference_spec_from_dict(kw["inference"])
        return cls(**kw)

    def to_json(self) -> str:
        """One JSON line (raises ``TypeError`` if a kwarg or meta value is not JSON)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, s: str) -> RolloutRequest:
        return cls.from_dict(json.loads(s))


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise TypeError(f"{cls.__name__}.from_dict expects a mapping, got {type(d).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{cls.__name__}.from_dict: unknown fields {sorted(unknown)} (known: {sorted(names)})")
    return dict(d)


# -- InferenceSpec <-> JSON ---------------------------------------------------------------
_TOOL_TAG = "__ToolRequest__"


def inference_spec_to_dict(spec: InferenceSpec) -> dict[str, Any]:
    """A JSON-ready dict of ``spec``; a :class:`ToolRequest` in ``extensions`` is tagged."""
    ext: dict[str, Any] | None = None
    if spec.extensions is not None:
        ext = {
            k: (
                {_TOOL_TAG: {"tools": list(v.tools), "tool_choice": v.tool_choice}} if isinstance(v, ToolRequest) else v
            )
            for k, v in spec.extensions.items()
        }
    sampling = None
    if spec.sampling is not None:
        sampling = asdict(spec.sampling)
        sampling["stop"] = list(spec.sampling.stop)
    return {"sampling": sampling, "return_": asdict(spec.return_), "extensions": ext}


def inference_spec_from_dict(d: Mapping[str, Any]) -> InferenceSpec:
    """Inverse of :func:`inference_spec_to_dict`."""
    kw = _known(InferenceSpec, d)
    if kw.get("sampling") is not None:
        kw["sampling"] = SamplingConfig(**kw["sampling"])
    if "return_" in kw:
        kw["return_"] = ReturnSpec(**kw["return_"])
    ext = kw.get("extensions")
    if ext is not None:
        kw["extensions"] = {
            k: (ToolRequest(**v[_TOOL_TAG]) if isinstance(v, Mapping) and set(v) == {_TOOL_TAG} else v)
            for k, v in ext.items()
        }
    return InferenceSpec(**kw)
