"""``StepperWidget``: buttons and fields over a :class:`~ludic_lab.lab.stepper.RolloutStepper`."""

from __future__ import annotations

import html
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ludic_lab.inference.request import SamplingConfig
from ludic_lab.lab.background import BackgroundTask, start_background

if TYPE_CHECKING:
    from ludic_lab.lab.stepper import RolloutStepper


class StepperWidget:
    """An ipywidgets panel over a :class:`RolloutStepper`: system prompt, temperature,
    max_tokens, top_p and sampling seed fields; Step / Re-run turn / Run to end / Reset
    buttons; the transcript below. Each action runs as a background task (``pending``), so
    the kernel stays responsive; ``wait()`` blocks until it is done (tests, scripts).

    Example: ``ui = stepper.widget(); ui`` (displays), ``ui.step_button.click()``.
    """

    def __init__(self, stepper: RolloutStepper) -> None:
        import ipywidgets as w

        self.stepper = s = stepper
        sc = s.sampling
        full = w.Layout(width="98%")
        self.system_prompt = w.Textarea(
            value=s.system_prompt or "", description="system", layout=w.Layout(width="98%", height="5em")
        )
        self.temperature = w.BoundedFloatText(
            value=sc.temperature, min=0.0, max=10.0, step=0.1, description="temperature"
        )
        self.max_tokens = w.BoundedIntText(value=sc.max_tokens, min=1, max=1_000_000, description="max_tokens")
        self.top_p = w.BoundedFloatText(value=sc.top_p, min=0.01, max=1.0, step=0.05, description="top_p")
        self.seed = w.Text(
            value="" if s.sampling_seed is None else str(s.sampling_seed), description="seed", placeholder="none"
        )
        self.step_button = w.Button(description="Step", button_style="primary")
        self.rerun_button = w.Button(description="Re-run turn")
        self.run_button = w.Button(description="Run to end")
        self.reset_button = w.Button(description="Reset")
        self.status = w.HTML()
        self.view = w.HTML(layout=full)
        self.buttons = [self.step_button, self.rerun_button, self.run_button, self.reset_button]
        self.step_button.on_click(lambda _b: self._launch("step"))
        self.rerun_button.on_click(lambda _b: self._launch("rerun"))
        self.run_button.on_click(lambda _b: self._launch("run"))
        self.reset_button.on_click(lambda _b: self._launch("reset"))
        self.box = w.VBox(
            [
                self.system_prompt,
                w.HBox([self.temperature, self.max_tokens, self.top_p, self.seed]),
                w.HBox([*self.buttons, self.status]),
                self.view,
            ]
        )
        self.pending: BackgroundTask | None = None
        self.last_error: BaseException | None = None
        self.refresh()

    def _settings(self) -> tuple[SamplingConfig, int | None, str]:
        raw = self.seed.value.strip()
        try:
            seed = None if raw in ("", "none", "None") else int(raw)
        except ValueError:
            raise ValueError(f"seed must be an integer or empty, got {raw!r}") from None
        sampling = replace(
            self.stepper.sampling,
            temperature=float(self.temperature.value),
            max_tokens=int(self.max_tokens.value),
            top_p=float(self.top_p.value),
        )
        return sampling, seed, self.system_prompt.value

    async def _do(self, action: str) -> None:
        s = self.stepper
        sampling, seed, sp = self._settings()
        if action == "rerun":
            await s.rerun(sampling=sampling, sampling_seed=seed, system_prompt=sp)
            return
        s.inference = replace(s.inference, sampling=sampling)
        s.sampling_seed = seed
        if action == "reset" or not s._started:
            await s.reset(system_prompt=sp)
            if action == "reset":
                return
        elif sp != (s.system_prompt or ""):
            raise ValueError("the system prompt changed: press 'Re-run turn' (restarts from turn 0) or 'Reset'")
        if action == "step":
            await s.step()
        elif action == "run":
            await s.run()

    def _launch(self, action: str) -> BackgroundTask | None:
        if self.pending is not None and not self.pending.done():
            self.status.value = "<i>busy: wait for the current action</i>"
            return None
        self.last_error = None
        for b in self.buttons:
            b.disabled = True
        self.status.value = f"<i>{action}…</i>"

        async def job() -> None:
            try:
                await self._do(action)
            except Exception as e:  # noqa: BLE001 - shown in the panel, kept in last_error
                self.last_error = e
            finally:
                self.refresh()

        self.pending = start_background(job(), output=False, name=f"stepper-{action}")
        return self.pending

    def wait(self, timeout: float | None = None) -> None:
        """Block until the current action is done (``TimeoutError`` after ``timeout`` s)."""
        if self.pending is not None:
            self.pending.wait(timeout)

    def refresh(self) -> None:
        """Redraw the transcript and the status line from the stepper's state."""
        s = self.stepper
        self.view.value = s.transcript_html()
        for b in self.buttons:
            b.disabled = False
        self.step_button.disabled = s.done or bool(s._broken)
        self.rerun_button.disabled = not s.turns
        self.run_button.disabled = s.done or bool(s._broken)
        if self.last_error is not None:
            e = self.last_error
            self.status.value = (
                f"<span style='color:#b00020'>{html.escape(type(e).__name__)}: {html.escape(str(e))}</span>"
            )
        else:
            self.status.value = "episode over" if s.done else f"turn {len(s.turns)}"

    def _repr_mimebundle_(self, **kw: Any) -> Any:
        return self.box._repr_mimebundle_(**kw)

    def __repr__(self) -> str:
        return f"StepperWidget({self.stepper!r})"
