"""``harbor_task``: Harbor / Terminal-Bench task folders as a :class:`~ludic_lab.task.Task`.

    task = harbor_task("ludic_lab/data/harbor")          # a folder of task folders: train / held-out
    run = train_env(task, steps=10, max_tokens=512)
    metrics = await task.evaluate(client)               # the held-out tasks
    one = harbor_task("path/to/one-task")               # one folder: its own held-out set

Each folder is read by Harbor's task models (:func:`~ludic_lab.task.harbor_folder.load_harbor_task`);
one this host cannot run is refused before anything runs, naming its needs. Each episode is one
:class:`~ludic_lab.task.harbor_env.HarborTaskEnv` step: a :class:`~ludic_lab.agents.ToolAgent`
with the workspace tools, sampled until it replies without a tool call (or ``max_turns``);
then Harbor's verifier scores the workspace it left. docs/harbor.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ludic_lab.envs.workspace import Snapshot, WorkspaceConfig
from ludic_lab.task.definition import Task, heldout_evaluator
from ludic_lab.task.harbor_env import HarborTaskEnv
from ludic_lab.task.harbor_folder import HarborTaskError, HarborTaskFolder, is_harbor_task, load_harbor_task
from ludic_lab.task.harbor_image import HarborUnsupportedError
from ludic_lab.task.repo_env import PoolLease, RepoEnvSettings
from ludic_lab.task.repo_task import DEFAULT_MAX_TURNS, repo_agent
from ludic_lab.types import Rollout

log = logging.getLogger(__name__)
HARBOR_SYSTEM_PROMPT = (
    "You are completing a task in a Linux workspace, which is your working directory. Use the tools: shell "
    "runs one bash command (each in a fresh shell: cd and variables do not carry over); read_file shows a file "
    "with line numbers; edit_file replaces one exact piece of text; write_file writes a whole file. When you are "
    "done, reply without a tool call: that ends your turn, and the task's tests then check the workspace."
)
HARBOR_DATA = Path(__file__).resolve().parent.parent / "data" / "harbor"
"""The shipped Harbor task folders (``ludic_lab/data/harbor/README.md``)."""
TOOL_NAMES = ("shell", "read_file", "write_file", "edit_file")
Split = Literal["train", "heldout", "all"]


def load_harbor_tasks(
    path: str | Path, *, skip_unsupported: bool = False
) -> tuple[list[HarborTaskFolder], dict[str, str]]:
    """The task folder at ``path``, or every task folder directly in it (sorted by name), and
    the refused ones (name -> why) when ``skip_unsupported``; else a refusal raises, naming all."""
    root = Path(path).expanduser()
    if is_harbor_task(root):
        return [load_harbor_task(root)], {}
    if not root.is_dir():
        raise HarborTaskError(f"{path}: no such folder")
    folders, refused = [], {}
    for sub in sorted(p for p in root.iterdir() if is_harbor_task(p)):
        try:
            folders.append(load_harbor_task(sub))
        except HarborUnsupportedError as e:
            refused[sub.name] = str(e)
    if not folders and not refused:
        raise HarborTaskError(f"{root}: neither a Harbor task folder (task.toml) nor a folder of them")
    if refused and not skip_unsupported:
        raise HarborUnsupportedError(root.name, [f"{k}: {v}" for k, v in refused.items()],
                                     "(skip_unsupported=True runs the others)")  # fmt: skip
    for name, why in refused.items():
        log.info("Harbor task %s skipped: %s", name, why)
    names = [f.name for f in folders]
    if len(set(names)) != len(names):
        raise HarborTaskError(f"{root}: task names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return folders, refused


def split_tasks(folders: Sequence[HarborTaskFolder], heldout: float | Sequence[str]) -> tuple[list, list]:
    """(train, held-out): the names in ``heldout``, or a fraction picked by a hash of each name
    (stable as tasks are added; at least one each side from two tasks on; one task: both)."""
    if len(folders) == 1:
        return list(folders), list(folders)
    if isinstance(heldout, str) or not isinstance(heldout, Sequence):
        frac = float(heldout)
        if not 0.0 < frac < 1.0:
            raise ValueError(f"heldout must be a fraction in (0, 1) or a list of task names, got {heldout!r}")
        count = min(len(folders) - 1, max(1, math.floor(frac * len(folders) + 0.5)))
        ranked = sorted(folders, key=lambda f: hashlib.sha256(f.name.encode()).hexdigest())
        names = {f.name for f in ranked[:count]}
    else:
        names = set(heldout)
        unknown = names - {f.name for f in folders}
        if unknown:
            raise ValueError(f"heldout names tasks that are not there: {sorted(unknown)}")
    return [f for f in folders if f.name not in names], [f for f in folders if f.name in names]


def harbor_task(path: str | Path, *, split: Split = "train", heldout: float | Sequence[str] = 0.25,
                skip_unsupported: bool = False, config: WorkspaceConfig | None = None, pool_size: int = 2,
                max_workspaces: int = 16, max_turns: int = DEFAULT_MAX_TURNS,
                system_prompt: str | None = HARBOR_SYSTEM_PROMPT, tools: Sequence[str] = TOOL_NAMES,
                settings: RepoEnvSettings | None = None, agent_options: Mapping[str, Any] | None = None,
                cache_dir: str | os.PathLike[str] | None = None, name: str | None = None,
                shuffle: bool = False) -> Task:  # fmt: skip
    """The Harbor task folder(s) at ``path`` as a :class:`Task` whose episodes work in a
    workspace and are rewarded by Harbor's verifier (module docstring). ``split``: the rows
    (``train``, ``heldout`` or ``all``); ``evaluate`` runs the held-out tasks (:func:`split_tasks`).
    ``config``: the workspaces' limits (links and environment come from each task);
    ``settings``, ``max_turns``, ``tools``, ``agent_options``: as :func:`~ludic_lab.task.repo_task.repo_task`."""
    folders, _ = load_harbor_tasks(path, skip_unsupported=skip_unsupported)
    train, held = split_tasks(folders, heldout)
    rows = {"train": train, "heldout": held, "all": list(folders)}.get(split)
    if rows is None:
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an int >= 1 (model turns per episode), got {max_turns!r}")
    offered = tuple(n for n in TOOL_NAMES if n in tools)
    if not offered or set(tools) - set(TOOL_NAMES):
        raise ValueError(f"tools must name some of {TOOL_NAMES}, got {list(tools)!r}")
    settings = settings or RepoEnvSettings()
    base = config or WorkspaceConfig()
    leases: dict[tuple, PoolLease] = {}
    by_path: dict[str, PoolLease] = {}
    snapshots = {str(f.path): harbor_snapshot(f, cache_dir=cache_dir) for f in folders}
    for f in folders:
        key = (tuple(sorted(f.image.links().items())), tuple(sorted(f.image.env.items())))
        if key not in leases:
            cfg = dataclasses.replace(base, links=dict(key[0]), env={**base.env, **dict(key[1])})
            leases[key] = PoolLease(None, size=pool_size, config=cfg, max_workspaces=max_workspaces)
        by_path[str(f.path)] = leases[key]
    options = dict(agent_options or {})
    label = name or ("harbor" if len(folders) > 1 else f"harbor-{folders[0].path.name}")

    def build(chosen: list[HarborTaskFolder], task_name: str, evaluate: Any) -> Task:
        pairs = [(f, snapshots[str(f.path)]) for f in chosen]

        def make_env(**_: Any) -> HarborTaskEnv:
            return HarborTaskEnv(pairs, by_path, settings, system_prompt)

        def make_protocol(client: Any) -> Any:
            from ludic_lab.interaction import SingleAgentSyncProtocol

            agent = repo_agent(client, max_turns=max_turns, system_prompt=system_prompt, tools=offered, **options)
            return SingleAgentSyncProtocol(agent)

        return Task(task_name, make_env, size=len(chosen), shuffle=shuffle, protocol_kind="workspace_agent",
                    protocol=make_protocol, reject_incomplete_completions=False, max_steps=1, evaluate=evaluate,
                    stats=harbor_stats)  # fmt: skip

    held_task = build(held, f"{label}-heldout", None)
    return build(rows, label, heldout_evaluator(held_task, harbor_stats))


def harbor_snapshot(folder: HarborTaskFolder, *, cache_dir: str | os.PathLike[str] | None = None) -> Snapshot:
    """The workspace's first tree: the Dockerfile's ``COPY`` files, written once into the cache
    (a folder per content digest); ``Snapshot.empty()`` when nothing is copied."""
    if not folder.image.copies:
        return Snapshot.empty()
    from ludic_lab.inference.models.cache import cache_root

    h = hashlib.sha256()
    for src, rel in folder.image.copies:
        h.update(f"{rel}\0".encode())
        for p in sorted(Path(src).rglob("*")) if os.path.isdir(src) else [Path(src)]:
            h.update(f"{p.relative_to(src) if os.path.isdir(src) else p.name}\0".encode())
            if p.is_file():
                h.update(p.read_bytes())
    base = cache_root(cache_dir) / "harbor"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in folder.name)[:60]
    target = base / f"{safe}-{h.hexdigest()[:20]}"
    if not target.is_dir():
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=base))
        try:
            folder.image.build(tmp / "tree")
            os.rename(tmp / "tree", target)
        except OSError:
            if not target.is_dir():  # not another process's copy landing first
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Snapshot.folder(target)


def harbor_stats(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Over ``rollouts``: ``resolved_rate`` (reward >= 1), ``mean_reward``, ``verifier_error_rate``
    (no reward file, or one Harbor refuses), ``agent_timeout_rate``, ``tool_calls_per_episode``,
    ``model_turns_per_episode``."""
    n = len(rollouts)
    if n == 0:
        return {}
    resolved = reward = errors = late = calls = turns = 0.0
    for r in rollouts:
        info = r.steps[-1].info if r.steps and not r.failed else {}
        resolved += bool(info.get("resolved"))
        reward += r.total_reward if not r.failed else 0.0
        errors += bool((info.get("verifier") or {}).get("error")) or r.failed
        late += bool(info.get("agent_timed_out"))
        tools = (info.get("agent") or {}).get("tools") or {}
        calls += tools.get("calls", 0)
        turns += tools.get("model_turns", 0)
    return {"resolved_rate": resolved / n, "mean_reward": reward / n, "verifier_error_rate": errors / n,
            "agent_timeout_rate": late / n, "tool_calls_per_episode": calls / n,
            "model_turns_per_episode": turns / n}  # fmt: skip
