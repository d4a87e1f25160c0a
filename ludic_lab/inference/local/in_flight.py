"""In-flight weight updates for :class:`~ludic_lab.inference.local.client.LocalChatClient`.

With ``weight_update="drain"`` (the default) a weight update stops admissions and waits for
every running completion to finish, so each completion is sampled by one policy version and
the update waits for the batch's longest member. With ``weight_update="in_flight"`` (continuous
scheduling) ``sync_weights`` waits only for the decode step (or prefill) under way: the
generation thread lets go of the client's lock between two steps while an update waits
(:func:`let_update_in`), the update loads, bumps the version and clears the prefix cache, and
the running rows go on under the new weights. Every token records the version it was sampled
under (``ChatResponse.token_versions`` / ``TokenTrace.token_versions``, set when a completion
spans versions; ``policy_version`` is then the oldest, what staleness is measured by).

What the rows attend over after the update (``in_flight_kv``):

- ``"keep"``: the keys and values already computed stay. The tokens sampled after the update
  come from the new weights attending over KV the old weights computed (for every position fed
  before the update), so their behaviour logprobs are neither the old policy's nor the new
  one's: a teacher-forced forward of either model does not reproduce them. Cheap; a trainer's
  importance ratio on those tokens then measures against this mixed policy.
- ``"recompute"``: the live rows leave the batch and rejoin it at once as continuations (their
  prompt and sampled ids prefilled under the new weights, their sampling state kept), so every
  token sampled after the update has exactly the new policy's logprob. Costs one prefill of
  every live row's sequence so far per update.

Either way a row that spans an update never stores its KV in the prefix cache unless that KV
was computed (or recomputed) under the current weights, and rows admitted after the update never
attend over a shared prefix (:mod:`.cascade`) computed under the old ones. A static batch
(``generate_batch``, ``complete_sync``: :mod:`.static`) holds the model to its end, so an
update still waits for it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ludic_lab.inference.local.continuous import ContinuousBatcher

WEIGHT_UPDATES = ("drain", "in_flight")
"""``LocalChatClient(weight_update=...)``: wait for the running rows, or load between two steps."""

IN_FLIGHT_KV = ("keep", "recompute")
"""``LocalChatClient(in_flight_kv=...)``: what the running rows' KV becomes at an in-flight update."""


def check_weight_update(weight_update: str, in_flight_kv: str, scheduling: str) -> None:
    """Raise ``ValueError`` naming the fix when the options are unknown or cannot work together
    (an in-flight update needs continuous scheduling: a static batch holds the model to its end)."""
    if weight_update not in WEIGHT_UPDATES:
        raise ValueError(f"LocalChatClient weight_update must be 'drain' or 'in_flight', got {weight_update!r}")
    if in_flight_kv not in IN_FLIGHT_KV:
        raise ValueError(f"LocalChatClient in_flight_kv must be 'keep' or 'recompute', got {in_flight_kv!r}")
    if weight_update == "in_flight" and scheduling != "continuous":
        raise ValueError(
            "LocalChatClient weight_update='in_flight' needs scheduling='continuous' (a static batch holds "
            "the model until its longest member ends); use weight_update='drain' with scheduling='static'"
        )


def let_update_in(batcher: ContinuousBatcher) -> None:
    """On the generation thread, between two decode steps, while a weight update waits: let go
    of the client's lock until no update waits, take it back, and (``in_flight_kv="recompute"``,
    when the weights did change) compute the live rows' KV again under the new weights."""
    c = batcher.client
    before = c.kv_version()
    c._lock.release()
    try:
        while c._updates_waiting:
            time.sleep(0.0005)
    finally:
        c._lock.acquire()
    if c.kv_version() == before:  # the update failed or timed out: nothing was loaded
        return
    batcher.in_flight_updates += 1
    if c.in_flight_kv == "recompute":
        batcher.recompute()
