"""``LiveStatus``: an object whose ``_repr_html_`` is shown below a cell and redrawn in place.

Shared by the lab's long-lived handles (:class:`~ludic_lab.lab.servers.VLLMServer`,
:class:`~ludic_lab.lab.torchrun.TorchrunRun`). IPython is imported only when drawing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


class LiveStatus:
    """Mixin: ``show()`` displays ``self._repr_html_()``; ``_draw()`` updates it when it changed.

    The class mixing it in defines ``_repr_html_``.
    """

    _handle: Any = None
    _last_html: str = ""

    if TYPE_CHECKING:

        def _repr_html_(self) -> str: ...

    def show(self) -> Any:
        """Display the status below the current cell (updated in place while it changes)."""
        from IPython.display import HTML, display

        self._handle = display(HTML(self._repr_html_()), display_id=True)
        return self

    def _draw(self, force: bool = False) -> None:
        if self._handle is None:
            return
        body = self._repr_html_()
        if body == self._last_html and not force:
            return
        self._last_html = body
        try:
            from IPython.display import HTML

            self._handle.update(HTML(body))
        except Exception:  # noqa: BLE001 - the kernel may be shutting down
            pass
