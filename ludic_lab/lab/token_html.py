"""Token-level HTML: the building blocks of the credit views (lab layer, pure strings).

A token view colours each token by the weight the loss actually sees (``weight x
action_mask``): a diverging scale centred on 0 (blue > 0, red < 0, white = 0), masked
(prompt) tokens grey. The scale's maximum ``|w|`` is passed in, so siblings of a group share
it. Every token span carries its data for hover (``title``) and for scripts (``data-*``):
token ids, logprob, ratio (when known), advantage and weight.

Text is decoded token by token with the tokenizer, but tokens whose bytes do not form whole
characters (a multi-byte character split across tokens) are grouped until they decode
cleanly, so nothing shows as ``\\ufffd`` garbage. Whitespace is kept as is (HTML-escaped,
``white-space: pre-wrap``): the concatenated text of the spans equals
``tokenizer.decode(ids)``. Without a tokenizer the token ids are shown instead of text.

Example: ``set_display_tokenizer(client)`` (a tokenizer, anything with ``.tokenizer``, or a
model path), then a ``SAWBatch`` in a cell renders itself; ``save_html(batch, "credit.html")``.
"""

from __future__ import annotations

import contextlib
import functools
import html
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POS_RGB = (33, 102, 172)
"""Colour of the largest positive weight (blue)."""
NEG_RGB = (178, 24, 43)
"""Colour of the largest negative weight (red)."""
MASKED_BG = "rgb(221, 221, 221)"
"""Background of masked tokens (not trained on): neutral grey."""
MASKED_FG = "rgb(102, 102, 102)"
COLOUR_NAMES = {"positive": "blue", "negative": "red", "zero": "white", "masked": "grey"}
"""The colours' names, as the legend (and any prose about a credit view) says them."""
MIN_TINT = 0.15
"""Smallest tint of a non-zero weight, so its sign stays visible however small it is."""

CSS = """
.ll-view{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;color:#222;line-height:1.4}
.ll-view .ll-seq{white-space:pre-wrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;
  line-height:1.6;tab-size:4;-moz-tab-size:4;word-break:break-word;overflow-wrap:anywhere;margin:2px 0}
.ll-view .ll-t{border-radius:2px;box-shadow:inset -1px 0 0 rgba(0,0,0,.13)}
.ll-view .ll-t:hover{outline:1px solid #222}
.ll-view .ll-nl::before{content:'\\21B5';opacity:.35}
.ll-view .ll-empty::after{content:'\\2205';opacity:.35}
.ll-view .ll-id{font-size:11px}
.ll-view .ll-head{font-size:12px;color:#444;margin:2px 0 4px 0}
.ll-view .ll-head b{color:#111}
.ll-view .ll-group{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(18em,100%),1fr));gap:8px;
  align-items:start;margin:6px 0 12px 0}
.ll-view .ll-card{min-width:0;border:1px solid #d0d0d0;border-radius:4px;padding:6px 8px;background:#fff}
.ll-view .ll-ghead{font-size:12.5px;border-bottom:1px solid #ccc;margin-top:10px;padding-bottom:2px}
.ll-view details>summary{cursor:pointer;color:#666;font-size:12px}
.ll-view .ll-msg{white-space:pre-wrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;
  border-left:3px solid #ccc;padding:1px 6px;margin:2px 0}
.ll-view .ll-err{color:#b00020}
.ll-view .ll-think{font-style:italic;text-decoration:underline dotted #8a6d00}
.ll-view .ll-legend span{display:inline-block;padding:0 6px;margin-right:2px;border-radius:2px;font-size:11px}
"""


# -- numbers and colours -----------------------------------------------------------------------
def fmt(x: float | None, signed: bool = True) -> str:
    """A short form of a number for headers and hover text (``-`` for ``None``)."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def weight_rgb(w: float, scale: float) -> tuple[int, int, int]:
    """Background colour of an action token with effective weight ``w``.

    White for ``w == 0``; otherwise a tint of blue (``w > 0``) or red (``w < 0``) whose
    strength is ``MIN_TINT + (1 - MIN_TINT) * |w| / scale`` (capped at full colour).
    """
    if w == 0 or not math.isfinite(w):
        return (255, 255, 255)
    end = POS_RGB if w > 0 else NEG_RGB
    t = MIN_TINT + (1.0 - MIN_TINT) * min(1.0, abs(w) / scale) if scale > 0 else 1.0
    return tuple(int(round(255 + (c - 255) * t)) for c in end)  # type: ignore[return-value]  # 3 channels in, 3 out


def _style(rgb: tuple[int, int, int]) -> str:
    light = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    fg = "#fff" if light < 140 else "#111"
    return f"background:rgb({rgb[0]}, {rgb[1]}, {rgb[2]});color:{fg}"


def scale_of(weights: Sequence[float]) -> float:
    """The colour scale of a set of effective weights: their largest ``|w|`` (1.0 if all 0)."""
    m = max((abs(w) for w in weights if math.isfinite(w)), default=0.0)
    return m if m > 0 else 1.0


def legend_html(scale: float) -> str:
    """A one-line legend of the diverging scale (``-scale``, 0, ``+scale``, masked)."""
    parts = [
        (weight_rgb(-scale, scale), f"{-scale:+.3g}"),
        (weight_rgb(-scale / 2, scale), f"{-scale / 2:+.3g}"),
        ((255, 255, 255), "0"),
        (weight_rgb(scale / 2, scale), f"{scale / 2:+.3g}"),
        (weight_rgb(scale, scale), f"{scale:+.3g}"),
    ]
    spans = "".join(f"<span style='{_style(rgb)};border:1px solid #ccc'>{txt}</span>" for rgb, txt in parts)
    c = COLOUR_NAMES
    return (
        f"<div class='ll-legend ll-head'>weight (x action mask): {spans}"
        f"<span style='background:{MASKED_BG};color:{MASKED_FG}'>masked</span> · "
        f"<b>{c['positive']}</b>: pushed up (made more likely) · <b>{c['negative']}</b>: pushed down · "
        f"{c['zero']}: weight 0, no signal · {c['masked']}: masked, not trained (prompt, tool results, "
        "observations)</div>"
    )


# -- tokenizers ----------------------------------------------------------------------------------
_display_tokenizer: Any = None


def resolve_tokenizer(tokenizer: Any = None) -> Any:
    """A tokenizer with ``decode``: ``tokenizer`` itself, its ``.tokenizer`` (a ChatTemplate,
    a LocalChatClient), one loaded from a path, or the one set by :func:`set_display_tokenizer`.
    Returns ``None`` when there is none (views then show token ids)."""
    tok = _display_tokenizer if tokenizer is None else tokenizer
    if tok is None:
        return None
    if isinstance(tok, (str, os.PathLike)):
        return _load_tokenizer(str(tok))
    inner = getattr(tok, "tokenizer", None)
    if not callable(getattr(tok, "decode", None)) and inner is not None:
        tok = inner
    if not callable(getattr(tok, "decode", None)):
        raise TypeError(f"not a tokenizer (no .decode): {type(tok).__name__}")
    return tok


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def set_display_tokenizer(tokenizer: Any) -> None:
    """Use ``tokenizer`` (a tokenizer, a ChatTemplate/LocalChatClient, or a model path) to
    decode tokens in every ``_repr_html_`` view; ``None`` goes back to showing token ids.

    Example: ``set_display_tokenizer(client)`` once, then ``rollout`` in a cell shows text.
    """
    global _display_tokenizer
    _display_tokenizer = None if tokenizer is None else resolve_tokenizer(tokenizer)


@contextlib.contextmanager
def display_tokenizer(tokenizer: Any) -> Iterator[None]:
    """Temporarily :func:`set_display_tokenizer` (restored on exit)."""
    global _display_tokenizer
    old = _display_tokenizer
    set_display_tokenizer(tokenizer)
    try:
        yield
    finally:
        _display_tokenizer = old


def _decode(tok: Any, ids: Sequence[int]) -> str:
    try:
        return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except TypeError:  # tokenizers without these keywords
        return tok.decode(list(ids))


@dataclass(frozen=True)
class TokenPiece:
    """Tokens ``[start, stop)`` of a sequence and the text they decode to (one or more tokens)."""

    start: int
    stop: int
    text: str


def token_pieces(ids: Sequence[int], tokenizer: Any, *, context: int = 6, max_group: int = 8) -> list[TokenPiece]:
    """Split ``ids`` into pieces of whole characters: one token each, except tokens that end
    inside a multi-byte character, which are grouped with the next ones until the text
    decodes cleanly (at most ``max_group`` tokens; invalid bytes then stay as ``\\ufffd``).

    Each piece's text is ``decode(context + piece) - decode(context)`` over up to ``context``
    previous tokens (so tokenizers that drop a word's leading space when it is decoded alone
    keep it); pieces concatenate to ``decode(ids)``.
    """
    ids = [int(i) for i in ids]
    pieces: list[TokenPiece] = []
    n = len(ids)
    i = 0
    while i < n:
        ctx_start = i
        for p in reversed(pieces):  # back to a piece boundary at least `context` tokens before i
            ctx_start = p.start
            if i - p.start >= context:
                break
        base = _decode(tokenizer, ids[ctx_start:i]) if ctx_start < i else ""
        j = i + 1
        while True:
            full = _decode(tokenizer, ids[ctx_start:j])
            text = full[len(base) :] if full.startswith(base) else _decode(tokenizer, ids[i:j])
            if not text.endswith("\ufffd") or j >= n or j - i >= max_group:
                break
            j += 1
        pieces.append(TokenPiece(i, j, text))
        i = j
    return pieces


# -- token spans -----------------------------------------------------------------------------
def _num(x: float | None) -> str:
    return "" if x is None else repr(float(x))


def _join(xs: Iterable[Any]) -> str:
    return " ".join(str(x) for x in xs)


def tokens_html(
    ids: Sequence[int],
    *,
    tokenizer: Any = None,
    mask: Sequence[int] | None = None,
    weights: Sequence[float] | None = None,
    logprobs: Sequence[float | None] | None = None,
    ratios: Sequence[float | None] | None = None,
    advantage: float | None = None,
    scale: float | None = None,
    start: int = 0,
    stop: int | None = None,
    reasoning: Sequence[int] | None = None,
) -> str:
    """Spans of tokens ``ids[start:stop]`` coloured by ``weights[t] * mask[t]`` (all per-token
    sequences align with ``ids``; ``mask`` defaults to all 1, ``weights`` to unknown = white).

    Masked tokens are grey; ``reasoning[t]`` set (thinking) makes them italic, underlined
    (``ll-think``, ``data-reasoning``). Each span has ``data-ids``, ``data-mask``, ``data-w``
    (effective weight, when known), ``data-logprob``/``data-ratio``/``data-adv`` when known,
    and a ``title`` with the same for hover. Returns the inner HTML of a ``.ll-seq`` block.
    """
    n = len(ids)
    per_token = {"mask": mask, "weights": weights, "logprobs": logprobs, "ratios": ratios, "reasoning": reasoning}
    for name, seq in per_token.items():
        if seq is not None and len(seq) != n:
            raise ValueError(f"tokens_html: {name} has {len(seq)} entries for {n} token ids")
    m = [1] * n if mask is None else [1 if x else 0 for x in mask]
    eff = None if weights is None else [float(w) * mk for w, mk in zip(weights, m, strict=True)]
    if scale is None:
        scale = scale_of(eff) if eff is not None else 1.0
    tok = resolve_tokenizer(tokenizer)
    stop = n if stop is None else stop
    sub = list(ids[start:stop])
    if tok is not None:
        pieces = [TokenPiece(p.start + start, p.stop + start, p.text) for p in token_pieces(sub, tok)]
    else:
        pieces = [TokenPiece(start + k, start + k + 1, f"\u2039{int(t)}\u203a") for k, t in enumerate(sub)]
    out = []
    for p in pieces:
        rng = range(p.start, p.stop)
        masked = all(m[t] == 0 for t in rng)
        attrs = {"data-ids": _join(int(ids[t]) for t in rng), "data-mask": "0" if masked else "1"}
        title = [("token " if len(rng) == 1 else "tokens ") + ", ".join(str(int(ids[t])) for t in rng)]
        w_piece: float | None = None
        if eff is not None:
            acts = [eff[t] for t in rng if m[t]] or [0.0]
            w_piece = sum(acts) / len(acts)
            attrs["data-w"] = _num(w_piece)
        if logprobs is not None:
            lps = [logprobs[t] for t in rng]
            if all(x is not None for x in lps) and not masked:
                attrs["data-logprob"] = _join(_num(x) for x in lps)
                title.append("logprob " + ", ".join(f"{x:.3f}" for x in lps))
        if ratios is not None:
            rs = [ratios[t] for t in rng]
            if all(x is not None for x in rs) and not masked:
                attrs["data-ratio"] = _join(_num(x) for x in rs)
                title.append("ratio " + ", ".join(f"{x:.3f}" for x in rs))
        if advantage is not None and not masked:
            attrs["data-adv"] = _num(advantage)
            title.append(f"adv {fmt(advantage)}")
        if masked:
            title.append("masked (not trained: prompt, observation or tool result)")
            style = f"background:{MASKED_BG};color:{MASKED_FG}"
        else:
            if w_piece is not None:
                title.append(f"weight {fmt(w_piece)}")
            style = _style(weight_rgb(w_piece or 0.0, scale))
        cls = "ll-t" + (" ll-nl" if "\n" in p.text else "") + (" ll-empty" if p.text == "" else "")
        cls += "" if tok is not None else " ll-id"
        if reasoning is not None and any(reasoning[t] for t in rng):
            cls, attrs["data-reasoning"] = cls + " ll-think", "1"
            title.append("reasoning (thinking): sampled, trained like the answer")
        attr_s = "".join(f' {k}="{html.escape(v, quote=True)}"' for k, v in attrs.items())
        out.append(
            f'<span class="{cls}" style="{style}"{attr_s} title="{html.escape(" · ".join(title), quote=True)}">'
            f"{html.escape(p.text, quote=False)}</span>"
        )
    return "".join(out)


def sequence_html(ids: Sequence[int], *, prompt_label: str = "prompt", **kw: Any) -> str:
    """A token sequence whose leading masked part (the prompt) is folded in ``<details>``;
    the rest (from the first action token) is shown. Keywords as :func:`tokens_html`."""
    mask = kw.get("mask")
    first = next((t for t, x in enumerate(mask) if x), len(ids)) if mask is not None else 0
    head = ""
    if first > 0:
        head_html = tokens_html(ids, stop=first, **kw)
        head = (
            f"<details><summary>{html.escape(prompt_label)} · {first} tokens (masked)</summary>"
            f"<div class='ll-seq'>{head_html}</div></details>"
        )
    body = tokens_html(ids, start=first, **kw) if first < len(ids) else ""
    return f"{head}<div class='ll-seq'>{body}</div>"


# -- pages ---------------------------------------------------------------------------------------
def view_html(body: str) -> str:
    """Wrap a view's body in a ``.ll-view`` block carrying its own stylesheet (for notebooks)."""
    return f"<div class='ll-view'><style>{CSS}</style>{body}</div>"


def html_page(fragment: str, title: str = "ludic_lab view") -> str:
    """A standalone UTF-8 HTML page around ``fragment``."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>body{{margin:1.2em}}</style></head><body>{fragment}</body></html>"
    )


def to_html(obj: Any) -> str:
    """The HTML of ``obj``: a string as is, else ``obj._repr_html_()``."""
    if isinstance(obj, str):
        return obj
    rep = getattr(obj, "_repr_html_", None)
    if not callable(rep):
        raise TypeError(f"{type(obj).__name__} has no HTML view (_repr_html_); pass an HTML string or a view")
    out = rep()
    if not isinstance(out, str):
        raise TypeError(f"{type(obj).__name__}._repr_html_ returned {type(out).__name__}, not str")
    return out


def save_html(obj: Any, path: str | os.PathLike, *, title: str | None = None) -> str:
    """Write ``obj``'s HTML view (anything with ``_repr_html_``, or an HTML string) to
    ``path`` as a standalone page (UTF-8, styles inline); returns the path.

    Example: ``save_html(batch, "credit.html")``, then open the file in a browser.
    """
    frag = to_html(obj)
    page = frag if frag.lstrip().lower().startswith("<!doctype") else html_page(frag, title or type(obj).__name__)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(page, encoding="utf-8")
    return str(p)


class HTMLView:
    """An HTML string that shows itself in a notebook and saves itself as a page.

    Example: ``v = HTMLView(html); v`` (renders), ``v.save("view.html")``.
    """

    def __init__(self, html_str: str, title: str = "ludic_lab view") -> None:
        self.html = html_str
        self.title = title

    def _repr_html_(self) -> str:
        return self.html

    def save(self, path: str | os.PathLike) -> str:
        """Write a standalone page; returns its path."""
        return save_html(self.html, path, title=self.title)

    def __repr__(self) -> str:
        return f"HTMLView({self.title!r}, {len(self.html)} chars)"
