"""A worker extension for tests: its in-place load plans stack fused shards in the wrong order.

Served with ``--worker-extension-cls vllm_fault_extension.SwappedShardsExtension`` (this
folder on ``PYTHONPATH``), it checks that the first in-place load of a name set is verified
against vLLM's own ``reload_weights`` and that a wrong plan can never serve: the server must
fall back to ``reload_weights`` and say why.
"""

from __future__ import annotations

from typing import Any

from ludic_lab.inference.vllm.server.worker import LudicWorkerExtension


class SwappedShardsExtension(LudicWorkerExtension):
    def ludic_load_file(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from ludic_lab.inference.vllm.weight_transfer import inplace

        if not getattr(inplace, "_test_swapped", False):
            right = inplace.build_plan

            def wrong(model: Any, names: Any) -> Any:
                plan, why = right(model, names)
                for rp in plan.repacks.values() if plan is not None else ():
                    if rp.n_shards > 1:  # e.g. [gate, up] -> [up, gate]: same shape, wrong rows
                        rp.weights = {i: rp.weights[rp.n_shards - 1 - i] for i in range(rp.n_shards)}
                return plan, why

            inplace.build_plan = wrong
            inplace._test_swapped = True
        return super().ludic_load_file(*args, **kwargs)
