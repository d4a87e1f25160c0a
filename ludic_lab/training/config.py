"""``TrainerConfig``: everything the optimisation loop needs to know (the reference's fields first)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ludic_lab.validation import check_config


@dataclass
class TrainerConfig:
    """Configuration of :class:`~ludic_lab.training.trainer.Trainer`."""

    model_device: str = "cpu"
    """Device the trained model lives on ("cpu", "cuda:0", ...)."""
    lr: float = 1e-5
    """Peak learning rate."""
    max_seq_len: int = 1024
    """Longest sequence (prompt + completion) trained on; longer ones follow ``truncation``."""
    micro_token_budget: int | None = None
    """Tokens per micro-batch (rows x row length, padding included); at least ``max_seq_len``.
    None: chosen by ``model_device`` (:attr:`effective_micro_token_budget`): on a CPU
    ``max(1024, max_seq_len)``, on an accelerator ``max(8192, max_seq_len)``. On a CPU the step's
    activations live in host memory: an agent-program run (SmolLM2, GRPO + LoRA, 32 episodes a
    step) peaked at 12.3 / 14.5 GB in its steps at 8192 and 6.3 / 6.6 GB at 1024, no slower
    (``bench/memory.py --paths agent``, docs/benchmarks.md)."""
    sync_every_steps: int = 1
    """Publish weights to the sampler every this many optimizer steps (0 = never)."""
    reuse_publish_buffers: bool = True
    """LoRA on CPU: write each publish's merged weights into the tensors of the previous one
    (one extra copy of the adapted weights stays allocated) instead of allocating them anew,
    which between steps often page-faults every byte again (SmolLM2, all linears: up to 0.8 s)."""
    release_host_memory: bool = True
    """On Linux (glibc): resident memory between steps stays within 10% of what it was at the end of
    the first step (or of the first step after a trim); past that, the free pages of malloc's arenas
    go back to the system (``malloc_trim``, process-wide, between steps only;
    :mod:`~ludic_lab.training.host_memory`). Without it a CPU run can grow from step to step
    (``bench/memory.py``). Steps keep the pool of freed memory they reuse: trimming it every step
    keeps only live memory resident, but the next step faults it in again (capitals 4 x 8:
    1.1-1.2x the CPU seconds a step, ``bench/memory_speed.py``).
    ``False``: glibc's defaults (freed memory kept for reuse, no bound)."""
    max_lag: int | None = None
    """Drop items sampled more than this many policy versions ago from each pulled batch
    (None = keep all). For sources that do not enforce staleness themselves (a
    ``RolloutBatchSource`` whose sampler lags, offline data); ``PipelineBatchSource`` takes
    its own ``max_lag`` and refills the batch instead (see :mod:`ludic_lab.training.staleness`)."""
    async_mode: Literal["sync", "one_step_ahead", "fully_async"] = "sync"
    """How sampling overlaps training (one process; under torchrun, the Redis pipeline).
    ``"sync"``: sample a batch, then optimise on it. ``"one_step_ahead"`` (= ``async_level=1``):
    the next batch is sampled while this step optimises. ``"fully_async"``: a
    ``RolloutBatchSource``'s groups generate continuously in the background, a group starting
    only while it would train at most ``max_staleness`` steps behind
    (:mod:`ludic_lab.rollouts.async_source`); each batch is the next groups to finish. Off the
    synchronous schedule each step trains on rollouts of older policies, which the loss's
    importance ratio ``pi / mu`` corrects (every built-in policy-gradient preset takes it; a
    loss of your own must too: read ``LossInputs.behaviour_anchor``). On a CPU give each stage
    its share of the cores (``num_threads`` here and the sampler's)."""
    max_staleness: int | None = None
    """``async_mode="fully_async"`` only: how many optimizer steps behind the current policy a
    sequence may be when it is trained on, measured per sequence by its oldest token's version
    (``SAWItem.policy_version``); staler ones are dropped and counted (``async/dropped_stale``).
    ``0`` trains exactly as ``"sync"``. None: 1 under ``"fully_async"`` (see
    :attr:`effective_max_staleness`)."""
    async_level: Literal[0, 1] = 0
    """The older spelling of ``async_mode``: ``1`` is ``async_mode="one_step_ahead"`` (the source
    is wrapped in a ``SampleAheadSource``, ``training/batching/sample_ahead.py``: each step trains
    on rollouts of the policy one version behind; ``max_lag`` must then be ``None`` or ``>= 1``);
    it pays when sampling and the step take about as long on their shares (README, "Against
    TRL"). ``0``: whatever ``async_mode`` says. Neither field rewrites the other (so
    ``dataclasses.replace`` changes what it says); :attr:`effective_async_mode` is the mode in effect."""
    num_threads: int | None = None
    """Intra-op threads of the trainer's step (set on its worker thread; torch's count is per
    thread). None: torch's default. With sampling overlapped (``async_mode``) on a CPU, about half the cores."""
    num_threads_alone: int | None = None
    """With ``async_level=1`` and ``num_threads``: the step's threads once the batch sampled
    ahead is in (the sampler then idles), from the next micro-batch until the next pull starts
    (``training/batching/core_share.py``). None: torch's count when the trainer is built (every
    core); equal to ``num_threads``: a static split."""

    grad_accum_steps: int = 1
    """Batches pulled from the source per optimizer step."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm (None = no clipping)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward (a layer's input kept, not its activations;
    on a CPU per packed segment, as the forward attends). SmolLM2 with LoRA: 1.6x the step's compute."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """Optimizer."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, ...] = (0.9, 0.999)
    """AdamW betas."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warmup (linear/cosine decay to 0 at ``total_steps``)."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    total_steps: int | None = None
    """Horizon of the linear/cosine schedule (required by them)."""
    scoring_temperature: float = 1.0
    """Temperature the trainer scores tokens at; match the sampling temperature."""
    logprob_chunk_size: int = 8192
    """Vocabulary chunk of the logprob computation (the full [B,T,V] logits never exist)."""
    autocast: Literal["off", "bf16"] = "off"
    """``"bf16"``: the policy's forward/backward runs under ``torch.autocast`` in bf16 while
    weights, gradients and optimizer state stay fp32. On a CPU with AVX512-BF16 or AMX the
    model's matmuls run 2-3x faster (``bench/vs_trl.py`` measures this machine's); the
    trainer's logprobs then differ from an fp32 sampler's (~1e-2), which the loss's importance
    ratio corrects (every built-in policy-gradient preset's). ``"off"``: compute in the weights' own dtype."""
    truncation: Literal["truncate", "drop", "error"] = "truncate"
    """What to do with an item longer than ``max_seq_len`` (counted in the metrics)."""
    share_prompts: bool | Literal["group", "prefix"] = True
    """Items of a step whose prompts begin alike share one copy of the common part in their
    packed row, so it is computed once in forward and backward; every item's logprobs and the
    gradient are those of scoring it alone (:mod:`.prompt_share`). ``"prefix"`` (``True``): a
    common prefix of at least 16 tokens is shared across groups too (a tool env's system prompt
    and tool schemas before each question), in units up to a row wide (on the tool env's step
    2,961 -> 1,644 tokens trained, forward/backward 0.70x: docs/benchmarks.md); ``"group"``: only
    items with the same whole prompt (a GRPO group), units of at most ``max_seq_len``. Needs the model's
    attention to take a custom mask (sdpa, eager); under flash/flex attention items are packed
    one by one. ``False``: always one by one."""
    skip_nonfinite: bool = True
    """Skip (and count) an optimizer step whose loss or gradient is NaN/inf instead of raising."""

    lora_r: int = 0
    """LoRA rank (0 = train all weights)."""
    lora_alpha: float | None = 16.0
    """LoRA alpha (scaling = alpha / r). None: ``2 * lora_r`` (scaling 2 at every rank), what
    ``ludic-lab demo`` and the pipeline trainer use."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names LoRA adapts."""

    fsdp: Literal["auto", "off"] = "auto"
    """``"auto"``: under ``torchrun`` with more than one rank (``WORLD_SIZE > 1``) shard the model
    with FSDP2 (``fully_shard`` per transformer block; gloo on CPU, NCCL on GPU). ``"off"``:
    never (each process trains alone)."""
    fsdp_block_classes: tuple[str, ...] = ()
    """Class names of the blocks to shard one by one (empty = ``model.layers`` and the like)."""
    fsdp_mixed_precision: bool = True
    """On GPU: bf16 parameters for compute, fp32 gradient reduction (CPU always stays fp32)."""
    batch_split: Literal["global", "per_rank"] = "global"
    """Under FSDP, what each rank's batch source yields. ``"global"``: every rank's source
    yields the same global batch and rank ``r`` trains a token-balanced, deterministic share
    of it. ``"per_rank"``: each rank's source yields that rank's own items (e.g. one queue
    consumer per rank). Either way the loss is normalised over the whole step's items."""
    dist_timeout_s: float = 600.0
    """Process-group timeout: how long a collective waits for a rank that never arrives."""

    seed: int = 0
    """Seeds torch/python/numpy at trainer start."""
    log_every: int = 1
    """Log metrics every this many steps."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (None = no automatic checkpoints)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0 = only when asked)."""
    keep_checkpoints: int = 2
    """How many automatic checkpoints to keep."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form values recorded with the run."""

    def __post_init__(self) -> None:
        """Refuse values that cannot work or would silently train differently (see
        :func:`~ludic_lab.validation.check_config`): NaN/inf, negatives, unknown choices."""
        check_config(self, _RANGES, hints=_HINTS)
        if self.micro_token_budget is not None and self.micro_token_budget < self.max_seq_len:
            raise ValueError(
                f"micro_token_budget ({self.micro_token_budget}) must be >= max_seq_len ({self.max_seq_len}) "
                "so that one full-length sequence fits in a micro-batch (None: chosen by model_device)"
            )
        if self.lr_schedule != "constant" and not self.total_steps:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} needs total_steps (the horizon it decays over)")
        if self.lr_schedule != "constant" and self.total_steps and self.warmup_steps > self.total_steps:
            raise ValueError(
                f"TrainerConfig.warmup_steps ({self.warmup_steps}) must be <= total_steps ({self.total_steps})"
            )
        if len(tuple(self.adam_betas)) != 2:
            raise ValueError(f"TrainerConfig.adam_betas must be two numbers (beta1, beta2), got {self.adam_betas!r}")
        self._check_async()
        if self.share_prompts not in (True, False, "group", "prefix"):
            raise ValueError(
                f"TrainerConfig.share_prompts must be True, False, 'group' or 'prefix', got {self.share_prompts!r}"
            )
        if self.lora_r > 0 and not self.lora_target_modules:
            raise ValueError("TrainerConfig.lora_target_modules must name at least one module when lora_r > 0")
        self.adam_betas = tuple(self.adam_betas)
        self.lora_target_modules = tuple(self.lora_target_modules)
        self.fsdp_block_classes = tuple(self.fsdp_block_classes)

    @property
    def effective_async_mode(self) -> str:
        """The mode in effect: ``async_mode``, or ``"one_step_ahead"`` when ``async_level=1``."""
        return "one_step_ahead" if self.async_level else self.async_mode

    @property
    def effective_max_staleness(self) -> int | None:
        """The staleness bound in effect: ``max_staleness``, 1 under ``"fully_async"`` when it is
        None, and None in the other modes."""
        if self.effective_async_mode != "fully_async":
            return None
        return 1 if self.max_staleness is None else self.max_staleness

    @property
    def effective_micro_token_budget(self) -> int:
        """The micro-batch budget in effect: ``micro_token_budget``, or when it is None
        ``max(1024, max_seq_len)`` on a CPU ``model_device`` and ``max(8192, max_seq_len)`` on any
        other (cuda, xpu, mps, ...)."""
        if self.micro_token_budget is not None:
            return self.micro_token_budget
        return max(CPU_MICRO_TOKENS if on_cpu(self.model_device) else ACCELERATOR_MICRO_TOKENS, self.max_seq_len)

    def effective_fields(self) -> dict[str, Any]:
        """The values in effect of the fields whose None means "chosen for you", under
        ``effective_<name>`` keys; a run folder's ``run.json`` records them next to the fields."""
        return {"effective_micro_token_budget": self.effective_micro_token_budget}

    def _check_async(self) -> None:
        """``async_mode`` and ``async_level`` do not contradict each other; ``max_staleness``
        belongs to ``"fully_async"`` and ``max_lag`` does not undercut it. Nothing is rewritten."""
        if self.async_level and self.async_mode == "fully_async":
            raise ValueError(
                "TrainerConfig: async_level=1 means async_mode='one_step_ahead', but async_mode='fully_async' was "
                "given; set only async_mode"
            )
        mode = self.effective_async_mode
        if mode != "fully_async" and self.max_staleness is not None:
            raise ValueError(
                f"TrainerConfig.max_staleness applies to async_mode='fully_async' only (the mode in effect is "
                f"{mode!r}); one_step_ahead is one version behind by construction, and max_lag drops "
                "stale items in any mode"
            )
        if mode == "one_step_ahead" and self.max_lag == 0:
            raise ValueError(
                "TrainerConfig.async_mode='one_step_ahead' (async_level=1) trains on rollouts sampled one policy "
                "version behind: max_lag must be None or >= 1 (max_lag=0 would drop them all)"
            )
        bound = self.effective_max_staleness
        if bound is not None and self.max_lag is not None and self.max_lag < bound:
            raise ValueError(
                f"TrainerConfig.max_lag ({self.max_lag}) < max_staleness ({bound}) would drop what the "
                "fully asynchronous source admitted: leave max_lag None (the source drops staler sequences itself)"
            )

    @property
    def lora_scale_alpha(self) -> float:
        """The LoRA alpha applied: ``lora_alpha``, or ``2 * lora_r`` when it is None."""
        return 2.0 * self.lora_r if self.lora_alpha is None else float(self.lora_alpha)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        d["lora_target_modules"] = list(self.lora_target_modules)
        d["fsdp_block_classes"] = list(self.fsdp_block_classes)
        d.update(self.effective_fields())
        return d


CPU_MICRO_TOKENS = 1024
"""``micro_token_budget=None`` on a CPU: at least this many tokens a micro-batch (see the field)."""
ACCELERATOR_MICRO_TOKENS = 8192
"""``micro_token_budget=None`` on an accelerator: at least this many tokens a micro-batch."""


def on_cpu(device: str) -> bool:
    """Whether ``device`` (``"cpu"``, ``"cpu:0"``, ``"cuda:1"``, ...) names the CPU."""
    return str(device).strip().lower().split(":", 1)[0] == "cpu"


_RANGES = {
    "lr": "> 0",
    "max_seq_len": ">= 2",
    "micro_token_budget": ">= 2",
    "sync_every_steps": ">= 0",
    "max_lag": ">= 0",
    "max_staleness": ">= 0",
    "num_threads": ">= 1",
    "num_threads_alone": ">= 1",
    "grad_accum_steps": ">= 1",
    "max_grad_norm": "> 0",
    "weight_decay": ">= 0",
    "adam_betas": "[0, 1)",
    "adam_eps": "> 0",
    "warmup_steps": ">= 0",
    "total_steps": ">= 1",
    "scoring_temperature": "> 0",
    "logprob_chunk_size": ">= 1",
    "lora_r": ">= 0",
    "lora_alpha": "> 0",
    "lora_dropout": "[0, 1)",
    "dist_timeout_s": "> 0",
    "log_every": ">= 1",
    "checkpoint_every": ">= 0",
    "keep_checkpoints": ">= 0",
}
"""What each numeric field of :class:`TrainerConfig` allows (NaN and infinities never)."""

_HINTS = {
    "max_grad_norm": "None turns clipping off; a negative norm would flip every gradient",
    "lora_r": "0 trains all weights",
    "lora_alpha": "None means 2 * lora_r",
    "sync_every_steps": "0 never publishes",
    "checkpoint_every": "0 saves only when asked",
    "keep_checkpoints": "0 keeps every checkpoint",
    "max_lag": "None keeps every item",
    "max_staleness": "0 trains as async_mode='sync'; None means 1 under fully_async",
    "micro_token_budget": "None chooses by model_device: 1024 on a CPU, 8192 on an accelerator (at least max_seq_len)",
}
