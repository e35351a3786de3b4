"""What the page shows from a session (`render`), the settings read from the page (`_settings`), the choices its menus
offer, and the decoding slots a handler waits for: plain functions, no layout and no events here."""
from __future__ import annotations

import functools
import html
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr

from adafuse import DecodeConfig
from adafuse.config import LEGACY
from adafuse.errors import AdafuseError, ConfigError
from adafuse.gate import load_gate
from adafuse.methods import MAX_MODELS
from adafuse.models import free_unused_memory
from adafuse.report import candidate_label
from adafuse.stops import format_stops, parse_stops

from . import plots
from .controller import ASSETS, Explorer, friendly, loaded_frame, slots, stop_note
from .explain_html import tree_html
from .sliders import BRANCHES, LAMBDA, MAX_NEW_TOKENS, MAX_NEW_WORDS, MAX_WORDS, TAU, WEIGHT

GATES = ASSETS / "gates"

THINKING = {"template default": None, "on": True, "off": False}
USER = "\0user"  # the stop box holds what the user typed: never replaced by a proposal


def gate_choices() -> list[tuple[str, str]]:
    """The shipped learned gates (assets/gates/*.json), labelled by the models and tasks they were trained for and by
    what their validation found on unseen lines (the file's "validated" record): one the record does not find better
    than equal weights is marked experimental. Files are read again only when they change."""
    files = sorted(GATES.glob("*.json"))
    return _gate_choices(tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files))


@functools.lru_cache(maxsize=4)
def _gate_choices(files: tuple[tuple[str, int, int], ...]) -> list[tuple[str, str]]:
    out = [("none (the weights below)", "")]
    for path, *_ in files:
        try:
            g = load_gate(path)
        except AdafuseError:
            continue
        tasks = ", ".join(g.trained.get("tasks", [])) or "?"
        per = " · NLL per word" if g.normalize == "word" else ""
        mark = " (experimental)" if not g.helps else ""
        out.append((f"{Path(path).stem}{mark}: {' + '.join(g.models)} · trained on {tasks}{per} · {g.summary}", path))
    return out


# the evaluation tables' headers before a run (Gradio shows "1 2 3" for a table without columns)
EVAL_SUMMARY_COLUMNS = ["task", "method", "n", "score", "sec/example"]
EXAMPLE_COLUMNS = ["line", "labels", "gold", "question"]

NORMALIZE = {"per token (paper)": "token", "per word": "word", "per byte": "byte"}


def gate_normalize(path: str, current: str):
    """The NLL averaging a picked gate was trained with (its weights are tuned to it); no gate: leave it as it is."""
    if not path:
        return current
    try:
        norm = load_gate(path).normalize
    except AdafuseError:
        return current  # the run reports the bad file
    return next((label for label, v in NORMALIZE.items() if v == norm), current)


def _settings(names, tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens, mode, stop,
              system, thinking, speculate, normalize, allow_empty, gate, *weights) -> DecodeConfig:
    """The page's settings as a decode takes them: each slider's value as typed, snapped to what the slider shows
    (`sliders.Spec.snap`; the page snaps its box the same way when it loses focus, and says so)."""
    picked = [WEIGHT.snap(w) for w in weights[: len([n for n in names or [] if str(n).strip()])]]
    if picked and not gate and not any(picked):
        raise ConfigError("every model's weight is 0: at least one model must count in the fused score")
    return DecodeConfig(tau=TAU.snap(tau), max_words=MAX_WORDS.snap(max_words), branches=BRANCHES.snap(branches),
                        diversity=bool(diversity), exploration=exploration, explore_lambda=LAMBDA.snap(lam),
                        max_new_words=MAX_NEW_WORDS.snap(max_new_words),
                        max_new_tokens=MAX_NEW_TOKENS.snap(max_new_tokens), mode=mode,
                        stop=parse_stops(stop), system=(system or "").strip(), thinking=THINKING[thinking],
                        weights=tuple(float(w) for w in picked) if len(set(picked)) > 1 else (), gate=gate or "",
                        speculate=bool(speculate), normalize=NORMALIZE.get(normalize, normalize),
                        allow_empty=bool(allow_empty))


def weight_sliders(names):
    """One weight slider per picked model, labelled by it; the others hidden."""
    names = [str(n).strip() for n in names or [] if str(n).strip()]
    return [gr.update(visible=i < len(names), label=f"Weight of {names[i]}" if i < len(names) else "Weight")
            for i in range(MAX_MODELS)]


def _choices(pending) -> list[tuple[str, int]]:
    if pending is None:
        return []
    out = []
    for i, c in enumerate(pending.candidates):
        score = "" if c.fused is None else f" · fused {c.fused:.3f}"
        star = " ★ winner" if i == pending.winner else ""
        out.append((f"{i}: {candidate_label(c.text, c.eos)}{score} · by {', '.join(c.proposers) or '—'}{star}", i))
    return out


def loaded_views(loaded: bool = True):
    """The loaded-models table and the unload menu (both left as they are when `loaded` is False)."""
    if not loaded:
        return gr.update(), gr.update()
    frame = loaded_frame()
    names = list(dict.fromkeys(frame["model"]))
    return frame, gr.update(choices=names, value=names[-1] if names else None)


def render(ex: Explorer, status: str = "", selected: int | None = None, export: bool = True, loaded: bool = False,
           live: bool = False):
    """Every view from the session's trace, in the order of OUTPUTS. `export=False` while rounds stream in: the
    trace file for the download button is written once the run ends, not rewritten every round. `loaded`: also
    refresh the loaded-models table (after models may have loaded or been evicted). `live`: a round that streamed
    in between two full drawings (`handlers.streamed`): the answer, the status and Cancel only, every chart and table
    left as it is."""
    t, pending = ex.trace, ex.pending
    paused = not ex.running and ex.decoding is not None and not ex.decoding.done and pending is None
    deciding = ex.running and t is not None and not t.rounds and pending is None and not t.stop_reason
    fused = plots.fused_html(t, pending, paused, deciding)
    if live:
        out = list(only_status(status))
        out[FUSED_AT], out[CANCEL_AT] = fused, gr.update(interactive=ex.running)
        return tuple(out)
    n = len(pool_rounds(ex))
    if selected is None or selected >= n:  # the newest round: the last one decided (Run), or the pending one (Step)
        selected = n - 1
    choices = _choices(pending)
    pool, picks = pool_view(ex, selected)
    return (
        fused,
        plots.compare_html(t, ex.singles, ex.others),
        plots.margins_figure(t),
        pool,
        plots.words_per_round_figure(t),
        rounds_table(t),
        plots.cost_frame(t, ex.singles),
        plots.cost_figure(t, ex.singles),
        # a decode of one round has nothing to pick: no slider over a single value (the pool's title names the round)
        gr.update(maximum=max(1, n - 1), value=max(0, selected), interactive=n > 1, visible=n > 1),
        gr.update(choices=choices, value=pending.winner if pending is not None else None,
                  interactive=bool(choices)),
        status,
        gr.update(value=ex.export(), interactive=t is not None) if export else gr.update(),
        *loaded_views(loaded),
        gr.update(interactive=ex.running),  # Cancel: only a Run (or branch) in flight has anything to stop
        tree_html(t, ex.branches),
        picks,
        ex.panel,
    )


def rounds_table(t):
    """The rounds table with widths that keep its columns in view (`plots.rounds_widths`)."""
    frame = plots.rounds_frame(t)
    return gr.update(value=frame, column_widths=plots.rounds_widths(frame))


def pool_rounds(ex: Explorer) -> list:
    """The rounds the Pool tab's slider steps through: the trace's, then in Step mode the pending one."""
    rounds = list(ex.trace.rounds) if ex.trace else []
    return rounds + [ex.pending] if ex.pending is not None else rounds


def pool_view(ex: Explorer, index: int):
    """The Pool tab on round `index` (the pending round when Step decided it): its candidates' figure and the first
    tokens the unsure models looked at."""
    t, pending = ex.trace, ex.pending
    if pending is not None and index == pending.index:
        return plots.pool_figure(t, index, pending), plots.selection_frame(replace(t, rounds=pool_rounds(ex)), index)
    return plots.pool_figure(t, index, None), plots.selection_frame(t, index)


FUSED_AT, STATUS_AT, CANCEL_AT = 0, 10, 14  # where the answer, the status and Cancel sit in render()'s tuple
N_OUTPUTS = 18  # render()'s length: ui.py checks it against the page's outputs


def only_status(text: str | None = None) -> tuple:
    """Leave every view as it is; set the status (None: leave it too)."""
    out = [gr.update()] * N_OUTPUTS
    if text is not None:
        out[STATUS_AT] = text
    return tuple(out)


def _error(ex: Explorer, exc: BaseException):
    msg = friendly(exc)
    gr.Warning(msg)
    return render(ex, f"⚠️ **Error:** {html.escape(msg)}", loaded=True)


def _confirm(ex: Explorer, kind: str, what: str, button: str) -> str:
    n = len(ex.trace.rounds) if ex.trace else 0
    if kind == "finished":  # a Step after the end: one more press starts over, on purpose
        return (f"✓ This decode has finished ({n} rounds, {html.escape(stop_note(ex.trace))}). Press **{button}** "
                f"again to start a new decode of the prompt box from round 0.")
    if kind == "replace":  # an opened or loaded trace is not a decode in progress: it can only be replaced
        return (f"⚠️ The views show {html.escape(what)} ({n} rounds). Press **{button}** again to decode the prompt "
                f"box anew with the settings on the page (this trace leaves the views), or Download it first.")
    return (f"⚠️ You changed {html.escape(what)} since this decode began ({n} round(s) so far). Press **{button}** "
            f"again to drop them and start a new decode, or change it back to go on where you are.")


def _example_note(prompt_text, mode, stop, max_words) -> str:
    stops = ", ".join(repr(x) for x in parse_stops(stop)) or "none"
    return (f"Example loaded: prompt mode **{mode}**, stop strings {html.escape(stops)}, **Max new words set to "
            f"{int(max_words)}** (settings panel). Press ▶ Run or Step ›.")


def restored(st: dict, n_models: int) -> list:
    """The page's values for a trace's settings, in the order of build_demo's `restorable`: an opened example Runs
    again as it was decoded (its method aside: the page decodes AdaFuse), each slider's as near as it can show."""
    gates = {path for _, path in gate_choices()}
    weights = list(st.get("weights") or ()) or [1.0] * n_models
    return [st.get("mode", "raw"), format_stops(st.get("stop", ())), TAU.snap(st.get("tau", 0.7)),
            MAX_WORDS.snap(st.get("max_words", 3)), BRANCHES.snap(st.get("branches", 3)), st.get("diversity", True),
            st.get("exploration", "surface"), LAMBDA.snap(st.get("explore_lambda", 1.0)),
            MAX_NEW_WORDS.snap(st.get("max_new_words", 40)), MAX_NEW_TOKENS.snap(st.get("max_new_tokens", 1024)),
            bool(st.get("speculate", False)),
            next((k for k, v in NORMALIZE.items() if v == st.get("normalize", LEGACY["normalize"])),
                 next(iter(NORMALIZE))),
            bool(st.get("allow_empty", LEGACY["allow_empty"])),  # a trace from before the settings: as decoded then
            st.get("gate", "") if st.get("gate", "") in gates else "", st.get("system", ""),
            *[WEIGHT.snap(weights[i]) if i < len(weights) else 1.0 for i in range(MAX_MODELS)]]


def in_line(ex: Explorer, kind: str):
    """Wait for one of the server's decoding slots (`slots()`), a generator: yields the visitor's place in line and a
    measured estimate (Cancel live: it leaves the line), then returns the ticket holding the slot — None when Cancel
    or Reset left the line. A handler closed while waiting (the page went away) leaves it too."""
    ticket = slots().ticket(kind)
    try:
        while not slots().try_take(ticket):
            if ex.cancel_requested:
                slots().release(ticket)
                return None
            out = list(only_status(slots().note(ticket)))
            out[CANCEL_AT] = gr.update(interactive=True)
            yield (ex, *out)
            time.sleep(1)
    except GeneratorExit:
        slots().release(ticket)
        raise
    ex.hold_slot()
    return ticket


def done_with(ticket: int | None) -> None:
    """A decoding handler ends: its slot goes to the next visitor, and the memory its decodes freed goes back to the
    system (a page's finished decodes keep no caches: see `Decoding._close`)."""
    slots().release(ticket)
    free_unused_memory()


def take_slot(ex: Explorer, kind: str) -> int | None:
    """`in_line` for a handler that returns once (Step): it waits without a status of its own."""
    waiting = in_line(ex, kind)
    while True:
        try:
            next(waiting)
        except StopIteration as done:
            return done.value
