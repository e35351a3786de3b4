"""AdaFuse Explorer layout and event wiring (layout first, wiring at the bottom)."""
from __future__ import annotations

import functools
import html
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr
import pandas as pd

from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, DecodeConfig
from adafuse.errors import AdafuseError, ConfigError
from adafuse.gate import load_gate
from adafuse.harness.tasks import TASKS, data_source
from adafuse.methods import MAX_MODELS
from adafuse.models import free_unused_memory
from adafuse.report import candidate_label
from adafuse.stops import format_stops, parse_stops, propose_stops

from . import analysis, api, plots
from .plots import count
from .controller import (ASSETS, COMPARE_METHODS, DECODE_QUEUE, EVAL_METHODS, Explorer, slots, device_choices, friendly,
                         load_examples, loaded_frame, remote_code_allowed, stop_note, unload)
from .divergence_view import divergence_figure, divergence_html
from .explain_html import token_view_html, tree_html
from .gpu import gpu

GATES = ASSETS / "gates"

CSS = """
/* contrast (WCAG AA): the default theme's subdued text, orange accent and red buttons are too light on white */
.gradio-container {--body-text-color-subdued: #4b5563; --color-accent: #c2410c; --color-accent-soft: #ffedd5;
  --button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
  --button-primary-text-color: #fff; --button-cancel-background-fill: #b91c1c;
  --button-cancel-background-fill-hover: #991b1b; --button-cancel-text-color: #fff; --link-text-color: #1d4ed8;
  --block-info-text-color: #4b5563}
.gradio-container .info-text, .gradio-container .info-text code {color: #374151}
.af-out {font-family: ui-serif, Georgia, serif; font-size: 1.08rem; line-height: 1.9; padding: 12px 14px;
         border: 1px solid #e5e7eb; border-radius: 10px; background: #fff; color: #111827; min-height: 64px;
         white-space: normal; overflow-wrap: anywhere; word-break: break-word; max-width: 100%}
.af-span {border-radius: 4px; padding: 1px 2px; margin: 0 1px; cursor: help; position: relative;
          text-underline-offset: 4px}
.af-span:focus-visible {outline: 2px solid #1d4ed8; outline-offset: 1px}
.af-span:focus::after {content: attr(data-tip); position: absolute; left: 0; top: 100%; z-index: 20;
          background: #111827; color: #fff; font: .8rem/1.4 ui-sans-serif, system-ui, sans-serif; padding: 4px 8px;
          border-radius: 6px; width: max-content; max-width: min(420px, 80vw); white-space: normal}
.af-sr {position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap}
.af-key {border-radius: 4px; padding: 1px 4px; text-underline-offset: 4px; color: #111827}
.af-legend {font-size: .85rem; color: #374151; margin-top: 6px}
.af-empty {color: #4b5563; padding: 10px}
.af-grid {display: grid; grid-template-columns: repeat(auto-fit, minmax(min(220px, 100%), 1fr)); gap: 12px}
.af-col {border: 1px solid #e5e7eb; border-radius: 10px; padding: 10px; background: #fafafa; color: #111827;
         min-width: 0}
.af-col pre {white-space: pre-wrap; overflow-wrap: anywhere; word-break: break-word; font-family: ui-serif, Georgia,
             serif; font-size: 1rem; margin: 6px 0 0}
.af-meta {font-size: .8rem; color: #4b5563}
#af-status {min-height: 1.5em}
/* the decision tree and token view inside Gradio's prose styles: plain lists, small left-aligned node buttons */
#af-tree ol, #af-tree ul {list-style: none; padding-left: 0; margin: 0}
#af-tree li::marker {content: none}
#af-tree li {margin: 0; padding-left: 0}
#af-tree button.af-node {font: inherit; font-size: .8rem; font-weight: 400; line-height: 1.35; text-align: left;
  color: #111827; background: #f9fafb; border: 1px solid #d1d5db; border-radius: 5px; padding: 4px 6px;
  display: block; width: 100%; min-height: 0; box-shadow: none}
#af-tree button.af-node:hover {background: #eef2ff}
#af-tree button.af-node.af-branch-point {box-shadow: inset 4px 0 0 #7c3aed}
#af-tree .af-label {font-weight: 600}
#af-tokens table {margin: 4px 0 10px}
/* a visible keyboard focus on every control (sliders, checkboxes, radios, tabs, tables, buttons) */
.gradio-container :is(button, input, textarea, select, [role=tab], [role=slider], [tabindex]):focus-visible,
.gradio-container label:focus-within:has(input[type=checkbox], input[type=radio]) {
  outline: 3px solid #1d4ed8 !important; outline-offset: 2px !important; box-shadow: 0 0 0 5px #bfdbfe !important}
.gradio-container input[type=range]:focus-visible {outline: 3px solid #1d4ed8 !important; outline-offset: 4px}
/* tables: headers wrap between words only, wide tables scroll sideways instead of cutting columns off */
.gradio-container table th, .gradio-container table th * {word-break: normal !important; overflow-wrap: normal !important;
  hyphens: none !important}
.gradio-container .table-wrap, .gradio-container .table-container {overflow-x: auto !important; max-width: 100%}
.af-example {border: 1px solid #c7d2fe; border-radius: 10px; padding: 8px 12px; background: #f8faff; color: #111827}
.af-example details p {max-height: 12em; overflow-y: auto; white-space: normal}
.af-notes {margin: 8px 0 0; padding-left: 1.2em}
.af-divergence {border-left: 4px solid #7c3aed; padding: 4px 10px; margin: 6px 0; background: #faf5ff}
"""

# Scroll the page to the status line and the answer under it when a decode starts (at 1280×800 they sit below
# the prompt and the examples)
TO_ANSWER = """() => { const el = document.getElementById('af-status');
  if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); }"""
TO_VIEWS = """() => { const el = document.getElementById('af-example');
  if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); }"""

# Keyboard shortcuts: Ctrl+Enter runs, Ctrl+Shift+Enter steps (also from inside the prompt box).
SHORTCUTS = """() => {
  if (window.afShortcuts) return;
  window.afShortcuts = true;
  document.addEventListener('keydown', (e) => {
    if (!(e.ctrlKey || e.metaKey) || e.key !== 'Enter') return;
    const id = e.shiftKey ? 'af-step' : 'af-run';
    const button = document.getElementById(id);
    if (button && !button.disabled) { e.preventDefault(); button.click(); }
  });
  // a decision-tree node that was not chosen: fill "Branch from round / with candidate", then branch
  document.addEventListener('click', (e) => {
    const node = e.target.closest && e.target.closest('#af-tree button[data-node]');
    if (!node) return;
    const [r, c] = node.dataset.node.split(':');
    const set = (id, v) => {
      const input = document.querySelector('#' + id + ' input');
      input.value = v;
      input.dispatchEvent(new Event('input', {bubbles: true}));
      input.dispatchEvent(new Event('change', {bubbles: true}));
    };
    set('af-branch-round', r);
    set('af-branch-cand', c);
    setTimeout(() => document.getElementById('af-branch').click(), 150);
  });
}"""

INTRO = """# AdaFuse Explorer
Several language models write **one answer together, word by word**. At each word start every model checks its
confidence margin Δ (top-1 minus top-2 probability): confident models **commit** up to M words, unsure ones
**explore** B distinct candidates; all candidates are scored by every model (length-normalized NLL) and the lowest
average wins. Hover a span (or Tab to it): its round, the runner-up and why it won. **Ctrl+Enter** runs,
**Ctrl+Shift+Enter** steps."""


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

NORMALIZE = {"per token (paper)": "token", "per word": "word"}


def gate_normalize(path: str, current: str):
    """The NLL averaging a picked gate was trained with (its weights are tuned to it); no gate: leave it as it is."""
    if not path:
        return current
    try:
        norm = load_gate(path).normalize
    except AdafuseError:
        return current  # the run reports the bad file
    return next((label for label, v in NORMALIZE.items() if v == norm), current)


def _whole(value, what: str) -> int:
    """A count typed into a slider's box: a whole number, or a typed error naming the setting (2.5 is not silently 2)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a whole number, not {value!r}") from None
    if not v.is_integer():
        raise ConfigError(f"{what} must be a whole number, not {value!r}")
    return int(v)


def _settings(names, tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens, mode, stop,
              system, thinking, speculate, normalize, gate, *weights) -> DecodeConfig:
    picked = [float(w) for w in weights[: len([n for n in names or [] if str(n).strip()])]]
    if picked and not gate and not any(picked):
        raise ConfigError("every model's weight is 0: at least one model must count in the fused score")
    return DecodeConfig(tau=float(tau), max_words=_whole(max_words, "M (most words a confident model commits)"),
                        branches=_whole(branches, "B (candidates an uncertain model explores)"),
                        diversity=bool(diversity), exploration=exploration, explore_lambda=float(lam),
                        max_new_words=_whole(max_new_words, "Max new words"),
                        max_new_tokens=_whole(max_new_tokens, "Max new tokens"), mode=mode,
                        stop=parse_stops(stop), system=(system or "").strip(), thinking=THINKING[thinking],
                        weights=tuple(picked) if len(set(picked)) > 1 else (), gate=gate or "",
                        speculate=bool(speculate), normalize=NORMALIZE.get(normalize, normalize))


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


def render(ex: Explorer, status: str = "", selected: int | None = None, export: bool = True, loaded: bool = False):
    """Every view from the session's trace, in the order of OUTPUTS. `export=False` while rounds stream in: the
    trace file for the download button is written once the run ends, not rewritten every round. `loaded`: also
    refresh the loaded-models table (after models may have loaded or been evicted)."""
    t, pending = ex.trace, ex.pending
    n = len(t.rounds) if t else 0
    if selected is None or selected >= n:  # the latest round that had a real choice to make
        selected = next((r.index for r in reversed(t.rounds) if len(r.candidates) > 1), n - 1) if t else -1
    choices = _choices(pending)
    paused = not ex.running and ex.decoding is not None and not ex.decoding.done and pending is None
    return (
        plots.fused_html(t, pending, paused),
        plots.compare_html(t, ex.singles, ex.others),
        plots.margins_figure(t),
        plots.pool_figure(t, selected, pending),
        plots.words_per_round_figure(t),
        plots.rounds_frame(t),
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
        plots.selection_frame(t, selected),
        ex.panel,
    )


STATUS_AT, CANCEL_AT = 10, 14  # where the status and the Cancel button sit in render()'s tuple


def only_status(text: str | None = None) -> tuple:
    """Leave every view as it is; set the status (None: leave it too)."""
    out = [gr.update()] * len(render(Explorer()))
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
    again as it was decoded (its method aside: the page decodes AdaFuse)."""
    gates = {path for _, path in gate_choices()}
    weights = list(st.get("weights") or ()) or [1.0] * n_models
    return [st.get("mode", "raw"), format_stops(st.get("stop", ())), st.get("tau", 0.7), st.get("max_words", 3),
            st.get("branches", 3), st.get("diversity", True), st.get("exploration", "surface"),
            st.get("explore_lambda", 1.0), st.get("max_new_words", 40), st.get("max_new_tokens", 1024),
            bool(st.get("speculate", False)),
            next((k for k, v in NORMALIZE.items() if v == st.get("normalize", "token")), next(iter(NORMALIZE))),
            st.get("gate", "") if st.get("gate", "") in gates else "", st.get("system", ""),
            *[weights[i] if i < len(weights) else 1.0 for i in range(MAX_MODELS)]]


def in_line(ex: Explorer, kind: str):
    """Wait for one of the server's decoding slots (`slots()`), a generator: yields the visitor's place in line and a
    measured estimate (Cancel live: it leaves the line), then returns the ticket holding the slot — None when Cancel
    or Reset left the line. A handler closed while waiting (Reset) leaves it too."""
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


def build_demo() -> gr.Blocks:
    slots()  # the decoding slots from the environment, now: a bad ADAFUSE_DECODE_SLOTS stops the launch, not a Run
    examples = load_examples()
    with gr.Blocks(title="AdaFuse Explorer") as demo:
        state = gr.State(None)
        gr.Markdown(INTRO)
        # settings are made first (the examples fill some of them) and placed in the settings column below
        models = gr.Dropdown(choices=list(BUNDLED) + list(PAPER_MODELS), value=list(DEFAULT_PAIR),
                             multiselect=True, allow_custom_value=True, render=False,
                             label="Base models (2–4; type any HF id or local path)", elem_id="af-models",
                             info="Place a model by typing `MODEL@cuda:1`, `MODEL@cpu` or `MODEL@auto,bfloat16` "
                                  "(auto: spread over every GPU; dtype float32, bfloat16 or float16); a model on a "
                                  "vLLM server: `vllm:http://HOST:PORT/v1#SERVED-NAME`.")
        tau = gr.Slider(0, 1, value=DecodeConfig.tau, step=0.05, label="τΔ: commit when Δ ≥ τΔ", render=False,
                        elem_id="af-tau")
        max_words = gr.Slider(1, 5, value=DecodeConfig.max_words, step=1, label="M: most words per confident round",
                              render=False, elem_id="af-m")
        branches = gr.Slider(1, 8, value=DecodeConfig.branches, step=1, label="B: candidates when unsure",
                             render=False, elem_id="af-b")
        diversity = gr.Checkbox(DecodeConfig.diversity, label="Diverse exploration (off = beam search)", render=False,
                                elem_id="af-diversity")
        exploration = gr.Radio(["surface", "embedding"], value=DecodeConfig.exploration, render=False,
                               elem_id="af-exploration",
                               label="Diverse in spelling (surface) or in meaning (embedding)",
                               info="embedding: each next first token maximizes log p − λ·(similarity of its input "
                                    "embedding to the tokens already picked)")
        lam = gr.Slider(0, 5, value=1.0, step=0.25, label="λ: redundancy penalty (embedding; 0 = surface)",
                        render=False, elem_id="af-lambda")
        max_new_words = gr.Slider(1, 200, value=40, step=1, label="Max new words", render=False,
                                  elem_id="af-max-words")
        max_new_tokens = gr.Slider(16, 2048, value=1024, step=16, elem_id="af-max-tokens", render=False,
                                   label="Max new tokens (each model's tokenizer; the larger count binds)")
        mode = gr.Radio(["raw", "chat"], value="raw", label="Prompt mode", render=False)
        stop = gr.Textbox(value="", lines=2, label="Stop strings (one per line, \\n for newline)", render=False,
                          elem_id="af-stop", info="Raw mode: proposed from the prompt as you type or paste it (\\n after "
                          "\"Answer:\", the next example's label such as \\nQuestion: when answers span lines) — "
                          "edit or clear them. Escapes: \\n \\t \\r \\\\.")
        system = gr.Textbox(value="", lines=2, label="System prompt (chat mode)", render=False, elem_id="af-system",
                            info="Put first as a system message where the chat template has that role, else at the "
                                 "start of the user message; raw mode ignores it (the trace says so).")
        thinking = gr.Radio(list(THINKING), value="template default", render=False, elem_id="af-thinking",
                            label="Thinking (chat templates with a switch, e.g. Qwen3)",
                            info="Models whose template has no switch ignore it; the trace notes which.")
        with gr.Row():
            with gr.Column(scale=2, min_width=320, elem_id="af-main"):  # first: on a phone the prompt comes first
                prompt = gr.Textbox(lines=5, label="Prompt", elem_id="af-prompt",
                                    placeholder="Type a prompt or pick an example below. Small models answer "
                                                "better after one worked example: \"Question: What is the capital "
                                                "of Italy?\nAnswer: Rome\n\nQuestion: Who wrote Hamlet?\nAnswer:\"")
                with gr.Row():
                    run_btn = gr.Button("▶ Run", variant="primary", elem_id="af-run")
                    step_btn = gr.Button("Step ›", elem_id="af-step")
                    cancel_btn = gr.Button("■ Cancel", variant="stop", elem_id="af-cancel", interactive=False)
                    reset_btn = gr.Button("↺ Reset", elem_id="af-reset")
                status = gr.Markdown("", elem_id="af-status")
                example_view = gr.HTML("", elem_id="af-example")  # an opened evaluation example: all about it
                gr.Examples(examples=[[e["prompt"], e["mode"], e["stop"], e["max_words"]] for e in examples],
                            inputs=[prompt, mode, stop, max_new_words], outputs=[status], fn=_example_note,
                            run_on_click=True, cache_examples=False, api_visibility="private",
                            example_labels=[e["label"] for e in examples], label="Examples")
                choice = gr.Dropdown(choices=[], label="Step mode: candidate to commit next (default: the winner)",
                                     interactive=False, elem_id="af-choice")
                fused = gr.HTML(plots.fused_html(None), elem_id="af-fused")
                with gr.Tabs(elem_id="af-views") as view_tabs:
                    with gr.Tab("Fused vs alone", id="compare"):
                        compare_view = gr.HTML(plots.compare_html(None, None), elem_id="af-compare")
                    with gr.Tab("Margins", id="margins"):
                        margins_plot = gr.Plot(plots.margins_figure(None), elem_id="af-margins")
                    with gr.Tab("Pool", id="pool"):
                        round_sel = gr.Slider(0, 1, value=0, step=1, label="Round", interactive=False,
                                              elem_id="af-round")
                        pool_plot = gr.Plot(plots.pool_figure(None), elem_id="af-pool")
                        picks_df = gr.Dataframe(plots.selection_frame(None, -1), wrap=True, elem_id="af-picks",
                                                label="First tokens the unsure models looked at: picked or skipped, "
                                                      "and why")
                    with gr.Tab("Tree", id="tree"):
                        gr.Markdown("Every round's pool; the chosen path is marked ✓. **Click a candidate that was "
                                    "not chosen** (or enter its round and number below) to branch a new decode from "
                                    "there: both answers then stand side by side under *Fused vs alone*.")
                        tree_view = gr.HTML(tree_html(None), elem_id="af-tree")
                        with gr.Row():
                            branch_round = gr.Number(label="Branch from round", precision=0, minimum=0,
                                                     elem_id="af-branch-round")
                            branch_cand = gr.Number(label="with candidate", precision=0, minimum=0,
                                                    elem_id="af-branch-cand")
                            branch_btn = gr.Button("Branch here", elem_id="af-branch")
                    with gr.Tab("Tokens", id="tokens"):
                        gr.Markdown("How each model tokenizes a candidate in context, each token's log-prob, the "
                                    "token that straddles the word boundary, and the top tokens at the word start "
                                    "with the margin Δ (needs the trace's models; they load if needed).")
                        with gr.Row():
                            tok_round = gr.Number(label="Round", precision=0, minimum=0, elem_id="af-tok-round")
                            tok_cand = gr.Number(label="Candidate", precision=0, minimum=0, value=0,
                                                 elem_id="af-tok-cand")
                            tok_btn = gr.Button("Show tokens", elem_id="af-tok-show")
                        tok_view = gr.HTML("", elem_id="af-tokens")
                    with gr.Tab("Words/round", id="wpr"):
                        wpr_plot = gr.Plot(plots.words_per_round_figure(None), elem_id="af-wpr")
                    with gr.Tab("Rounds & cost", id="rounds"):
                        rounds_df = gr.Dataframe(plots.rounds_frame(None), label="Rounds", elem_id="af-rounds",
                                                 wrap=True)
                        cost_plot = gr.Plot(plots.cost_figure(None), elem_id="af-cost")
                        cost_df = gr.Dataframe(plots.cost_frame(None), label="Forward passes, tokens fed, seconds",
                                           elem_id="af-cost-table")
            with gr.Column(scale=1, min_width=300, elem_id="af-settings"):
                models.render()
                device = gr.Dropdown(device_choices(), value="default", label="Device for all models",
                                     info="Added to each model without its own @DEVICE; default: CUDA when "
                                          "present, else CPU.", elem_id="af-device")
                load_btn = gr.Button("Load models", size="sm")
                load_status = gr.Markdown("Bundled pair preselected; models load on first use.",
                                          elem_id="af-load-status")
                trust = gr.Checkbox(False, label="Trust remote code (runs the Python a model's repository ships: "
                                                 "only for repositories you trust)", elem_id="af-trust",
                                    interactive=remote_code_allowed(),
                                    info=None if remote_code_allowed() else "off on this server "
                                         "(ADAFUSE_ALLOW_REMOTE_CODE)")
                for c in (tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens,
                          mode, stop):
                    c.render()
                with gr.Accordion("Model weights in the fused score", open=False):
                    gr.Markdown("Fused score = Σ w·NLL / Σ w: a stronger model can count more (0: shown, not "
                                "counted). Equal weights are the paper's mean.")
                    weights = [gr.Slider(0, 5, value=1, step=0.25, label=f"Weight of {n}" if i < len(DEFAULT_PAIR)
                                         else "Weight", visible=i < len(DEFAULT_PAIR), elem_id=f"af-weight-{i}")
                               for i, n in enumerate(list(DEFAULT_PAIR) + [""] * (MAX_MODELS - len(DEFAULT_PAIR)))]
                    normalize = gr.Radio(list(NORMALIZE), elem_id="af-normalize",
                                         value=next(k for k, v in NORMALIZE.items() if v == DecodeConfig.normalize),
                                         label="Each model's NLL of a candidate, averaged",
                                         info="Per token by default, as everywhere (the paper's rule; measured the "
                                              "better default: docs/defaults.md). Per token a word with a near-certain "
                                              "tail (\" 1.\": an unsure \" 1\", a sure \".\") can beat a likelier "
                                              "word; per word counts a word's whole NLL, the end of the answer one "
                                              "word, so ending early wins more often.")
                    gate = gr.Dropdown(gate_choices(), value="", label="Learned gate (per-round weights)",
                                       info="Weights each round from what the models show (margin, entropy, "
                                            "confidence, own NLL, position); replaces the sliders. Trained for "
                                            "the models it names and sets the NLL averaging it learned with.",
                                       elem_id="af-gate")
                with gr.Accordion("Chat mode: system prompt and thinking", open=False):
                    system.render()
                    thinking.render()
                speculate = gr.Checkbox(DecodeConfig.speculate, elem_id="af-speculate",
                                        label="Speculative proposals (same decode, fewer forward passes)",
                                        info="A confident model first checks the spans proposed before it this "
                                             "round in one forward and takes their tokens where it would have "
                                             "written them; the cost view counts drafts, accepted tokens, "
                                             "forwards saved.")
                compare = gr.Checkbox(True, label="Also run each model alone (greedy)")
                others = gr.CheckboxGroup(list(COMPARE_METHODS), value=[], label="Also decode with (side by side)")
                with gr.Accordion("Loaded models", open=True):
                    # wrapped, in widths that leave every column in view in the narrow settings column (1280 px)
                    loaded_df = gr.Dataframe(loaded_frame([]), label="Loaded models", interactive=False,
                                             elem_id="af-loaded", wrap=True,
                                             column_widths=["36%", "14%", "20%", "15%", "15%"])
                    with gr.Row():
                        unload_pick = gr.Dropdown([], label="Loaded model", scale=2, elem_id="af-unload-pick")
                        unload_btn = gr.Button("Unload", size="sm", scale=1, elem_id="af-unload")

        with gr.Tabs():  # work on many prompts, and traces kept as files: full width below
            with gr.Tab("Evaluate", id="eval"):
                gr.Markdown("Run a small batch of a benchmark task with several methods, then open any "
                            f"example's trace in the views above. Data: {data_source()}.")
                with gr.Row():
                    eval_task = gr.Dropdown(list(TASKS), value="triviaqa", label="Task", elem_id="af-eval-task")
                    eval_n = gr.Slider(1, 20, value=3, step=1, label="Examples")
                    eval_methods = gr.CheckboxGroup(list(EVAL_METHODS), value=["adafuse", "greedy"],
                                                    label="Methods")
                eval_btn = gr.Button("Run evaluation", elem_id="af-eval-run")
                eval_status = gr.Markdown("", elem_id="af-eval-status")
                eval_summary = gr.Dataframe(pd.DataFrame(columns=EVAL_SUMMARY_COLUMNS), label="Summary",
                                            elem_id="af-eval-summary", wrap=True)
                gr.Markdown("**Examples** — one row per example: every method's answer, its score under the "
                            "task's metric, ✓/✗ (right: exact match for QA, the final number for GSM8K, chrF ≥ 50 "
                            "for translation) and labels computed from those. Click a column header to sort, a row "
                            "to pick it, then open it in the views above; the CSV has every field in full.")
                with gr.Row():
                    eval_filter = gr.Dropdown([analysis.ALL, *analysis.LABELS], value=analysis.ALL,
                                              label="Show", elem_id="af-eval-filter", scale=2)
                    eval_csv = gr.DownloadButton("⬇ Examples as CSV", value=None, interactive=False,
                                                 elem_id="af-eval-csv", scale=1)
                eval_table = gr.Dataframe(pd.DataFrame(columns=EXAMPLE_COLUMNS), wrap=True, elem_id="af-eval-table",
                                          label="Examples", interactive=False, max_height=420)
                with gr.Row():
                    open_line = gr.Number(label="Example (line)", precision=0, elem_id="af-open-line")
                    open_method = gr.Dropdown([], label="Method", allow_custom_value=True, elem_id="af-open-method")
                    open_btn = gr.Button("Open in the explorer views", elem_id="af-open")
                with gr.Accordion("Where and why the ensemble leaves each member (this run)", open=False):
                    div_member = gr.Dropdown([], label="Member", elem_id="af-div-member")
                    div_plot = gr.Plot(plots.empty_figure("Where the ensemble leaves a member"),
                                       elem_id="af-div-plot")
            with gr.Tab("Export / load trace", id="io"):
                download = gr.DownloadButton("⬇ Download trace (JSON)", value=None, interactive=False,
                                             elem_id="af-download")
                upload = gr.UploadButton("📂 Load a saved trace (.json; browse it without any model)",
                                         file_types=[".json"], elem_id="af-upload")

        outputs = [fused, compare_view, margins_plot, pool_plot, wpr_plot, rounds_df, cost_df, cost_plot, round_sel,
                   choice, status, download, loaded_df, unload_pick, cancel_btn, tree_view, picks_df, example_view]
        assert outputs[STATUS_AT] is status and outputs[CANCEL_AT] is cancel_btn
        settings = [models, tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens,
                    mode, stop, system, thinking, speculate, normalize, gate, *weights]
        # what opening an evaluated example sets back to the settings it was decoded with (`restored`)
        restorable = [mode, stop, tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens,
                      speculate, normalize, gate, system, *weights]
        api.register()  # /decode and /models for gradio_client

        # ---- wiring ----
        @gpu
        def on_load(names, dev, allow):
            done = []
            try:
                for i, n, spec, lm, secs in Explorer(trust_remote_code=bool(allow)).load_each(names, dev):
                    if lm is None:
                        yield "\n\n".join(done + [f"… loading model {i} of {n}: {spec}"])
                    else:
                        done.append(f"✓ {lm.describe()} ({secs:.1f}s)")
                yield "\n\n".join(done)
            except Exception as exc:  # noqa: BLE001 - shown to the user, app keeps serving
                yield "\n\n".join(done + [f"⚠️ {friendly(exc)}"])

        def on_unload(name):
            try:
                msg = unload(name)
            except Exception as exc:  # noqa: BLE001
                msg = f"⚠️ {friendly(exc)}"
            return (msg, *loaded_views())

        @gpu
        def shown(ex, status: str, **kw):
            """The outputs for session `ex`, or for the fresh one a Reset made while this handler was still working
            (its last outputs must not bring the old session back)."""
            if ex.replaced_by is not None:
                return (ex.replaced_by, *render(ex.replaced_by, "↺ reset"))
            return (ex, *render(ex, status, **kw))

        def failed(ex, exc):
            """A handler's error, unless a Reset replaced the session meanwhile (then the fresh one is shown)."""
            return shown(ex, "") if ex.replaced_by is not None else (ex, *_error(ex, exc))

        def on_run(ex, names, dev, allow, prompt_text, want_singles, other_methods, picked, *s):
            ex = ex or Explorer()
            ex.trust_remote_code = bool(allow)
            if ex.running:
                yield (ex, *only_status("A decode is already running in this session: wait, or press ■ Cancel."))
                return
            ticket, pressed = None, time.monotonic()  # the status's clock: what the visitor waited, each part named
            try:
                cfg = _settings(*s)
                kind, what = ex.plan(names, cfg, prompt_text, dev)
                if kind in ("confirm", "replace"):
                    yield (ex, *render(ex, _confirm(ex, kind, what, "▶ Run")))
                    return
                ex.running, ex.cancel_requested, ex.live_config = True, False, None
                ticket = yield from in_line(ex, "run")
                parts, t = {"waiting for a slot": time.monotonic() - pressed}, time.monotonic()
                if ticket is None:
                    ex.running = False
                    yield shown(ex, "■ left the line: nothing was decoded")
                    return
                for i, n, spec, lm, secs in ex.load_each(names, dev):  # a cold start says which model it is on
                    if lm is None:
                        yield shown(ex, f"… loading model {i} of {n}: {html.escape(spec)}", export=False)
                    elif secs > 1:
                        yield shown(ex, f"… {html.escape(lm.name)} ready ({secs:.1f}s)", export=False, loaded=True)
                parts["loading models"], t = time.monotonic() - t, time.monotonic()
                yield shown(ex, "… reading the prompt", export=False)
                before = ex.decoding
                d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)
                changed = f" ({what} from round {d.trace.changes[-1]['from_round']})" if what else ""
                if d is before and d.pending is not None and picked is not None:  # the step mode's pick goes first
                    r = d.commit(int(picked))
                    changed += f" (round {r.index}: " + ("your pick" if r.overridden else "the winner") + ")"
                yield shown(ex, f"… decoding{changed}", export=False, loaded=True)
                moved = ""  # the last settings moved during the Run, said on every round's line after it
                while not d.done and not ex.cancel_requested and not ex.past_deadline(d):
                    r = d.step()
                    now = ex.apply_live(d)  # settings moved during the Run: from the next round on, marked
                    moved = f" · {now} from round {d.trace.changes[-1]['from_round']}" if now else moved
                    yield shown(ex, f"… round {r.index + 1} · {count(d.trace.words, 'word')}{html.escape(moved)}",
                                export=False)
                t = time.monotonic()
                if not ex.cancel_requested:
                    for label in ex.run_others(names, cfg, prompt_text, other_methods, dev):
                        yield shown(ex, f"… {label} done", export=False)
                if want_singles and not ex.cancel_requested:
                    for name in ex.run_singles(names, cfg, prompt_text, dev):
                        yield shown(ex, f"… {name} alone done", export=False)
                parts["the comparisons"] = time.monotonic() - t
                ex.running = False
                if ex.cancel_requested and not d.done:  # kept unfinished: Step or Run goes on from these words
                    kept = count(d.trace.words, 'word')
                    yield shown(ex, f"■ cancelled after round {len(d.trace.rounds)}: the {kept} so far "
                                    f"{'is' if d.trace.words == 1 else 'are'} kept — Step › or ▶ Run continues "
                                    "from there, ↺ Reset starts over",
                                loaded=True)
                    return
                if ex.cancel_requested:  # the fused decode had finished: only the comparisons were stopped
                    yield shown(ex, f"■ cancelled the comparisons; the fused decode had finished: "
                                    f"{count(d.trace.words, 'word')}, {stop_note(d.trace)}", loaded=True)
                    return
                named = ", ".join(f"{k} {v:.1f}s" for k, v in parts.items() if v >= 0.1)
                yield shown(ex, f"✓ done: {count(d.trace.words, 'word')} in {count(len(d.trace.rounds), 'round')} "
                                f"({d.trace.seconds:.1f}s wall clock of the fused decode; "
                                f"{time.monotonic() - pressed:.1f}s in all{': ' + named if named else ''}), "
                                f"{stop_note(d.trace)}", loaded=True)
            except Exception as exc:  # noqa: BLE001
                ex.running = False
                yield failed(ex, exc)
            finally:  # also when Reset closes this run
                ex.running = False
                done_with(ticket)

        @gpu
        def on_step(ex, names, dev, allow, prompt_text, picked, *s):
            ex = ex or Explorer()
            ex.trust_remote_code = bool(allow)
            if ex.running:  # a toast: the running decode keeps writing the status line
                msg = "Step is not available while ▶ Run is decoding: wait for it to end, or press ■ Cancel first."
                gr.Warning(msg)
                return (ex, *only_status(msg))
            ex.running, ex.cancel_requested = True, False  # Run, Branch, loading wait; Cancel waits for the phase
            ticket = None
            try:
                cfg = _settings(*s)
                kind, what = ex.plan(names, cfg, prompt_text, dev, step=True)
                if kind in ("confirm", "replace", "finished"):
                    return (ex, *render(ex, _confirm(ex, kind, what, "Step ›")))
                ticket = take_slot(ex, "step")
                if ticket is None:
                    ex.running = False
                    return shown(ex, "■ left the line: nothing was stepped")
                before = ex.decoding
                d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)
                fresh = d is not before
                if not fresh and d.pending is not None:
                    r = d.commit(int(picked) if picked is not None else None)
                    note = f"committed round {r.index}" + (" (your override)" if r.overridden else "")
                else:
                    note = "started" if fresh else f"continued from round {len(d.trace.rounds)}"
                if what and not fresh:
                    note += f" · {what} from round {d.trace.changes[-1]['from_round']}"
                if ex.cancel_requested:  # Cancel pressed while this step ran
                    d.cancel()
                    note += "; cancelled"
                elif not d.done:
                    p = d.propose()
                    note += f"; round {p.index} decided — pick a candidate or press Step to accept the winner"
                else:
                    note += f"; finished ({stop_note(d.trace)})"
                ex.running = False
                return shown(ex, f"› {html.escape(note)}", loaded=True)
            except Exception as exc:  # noqa: BLE001
                ex.running = False
                return failed(ex, exc)
            finally:
                ex.running = False
                done_with(ticket)

        def on_cancel(ex):
            ex = ex or Explorer()
            if ex.request_cancel():  # the run ends itself after the round under way and says so
                gr.Info("Cancelling after the round under way", duration=4)
                return (ex, *only_status())
            return (ex, *render(ex, "nothing is running: Step › or ▶ Run continues the decode on view, ↺ Reset "
                                    "starts over" if ex.trace else "nothing is running"))

        @gpu
        def on_branch(ex, r_idx, c_idx):
            ex = ex or Explorer()
            if ex.running:
                yield (ex, *only_status("Wait for the Run to end (or ■ Cancel it) before branching."))
                return
            ticket = None
            try:
                ex.running, ex.cancel_requested = True, False
                ticket = yield from in_line(ex, "branch")
                if ticket is None:
                    ex.running = False
                    yield shown(ex, "■ left the line: nothing was branched")
                    return
                yield shown(ex, f"… branching from round {r_idx}: deciding the rounds before it again", export=False)
                for label, d in ex.branch(r_idx, c_idx):
                    yield shown(ex, f"… {html.escape(label)}: round {len(d.trace.rounds)} · "
                                    f"{count(d.trace.words, 'word')}", export=False)
                ex.running = False
                yield shown(ex, f"✓ {html.escape(label)}: {count(d.trace.words, 'word')} ({stop_note(d.trace)}); "
                                "see it beside the original under *Fused vs alone*", loaded=True)
            except Exception as exc:  # noqa: BLE001
                ex.running = False
                yield failed(ex, exc)
            finally:
                ex.running = False
                done_with(ticket)

        @gpu
        def on_tokens(ex, r_idx, c_idx):
            ex = ex or Explorer()
            try:
                return token_view_html(ex.tokens(r_idx, c_idx))
            except Exception as exc:  # noqa: BLE001
                return f'<div class="af-empty">⚠️ {html.escape(friendly(exc))}</div>'

        def on_reset(ex):
            fresh = Explorer()
            if ex is not None:
                ex.cancel_requested = True  # a run still under way stops at its next round
                ex.replaced_by = fresh      # and whatever it shows last is this fresh session
            return (fresh, *render(fresh, "↺ reset"))

        def on_round(ex, idx):
            ex = ex or Explorer()
            return plots.pool_figure(ex.trace, int(idx), None), plots.selection_frame(ex.trace, int(idx))

        def on_upload(ex, file):
            ex = ex or Explorer()
            if file is None:
                return (ex, *only_status())
            if ex.running:
                return (ex, *only_status("Wait for the Run to end (or ■ Cancel it) before loading a trace."))
            try:
                t = ex.load_trace(file if isinstance(file, str) else file.name)
                return (ex, *render(ex, f"📂 loaded a trace of {len(t.rounds)} rounds ({', '.join(t.models)})"))
            except Exception as exc:  # noqa: BLE001
                return (ex, *_error(ex, exc))

        @gpu(duration=600)
        def on_eval(ex, task_name, n, methods, names, dev, allow, tau_v, m_v, b_v, norm,
                    progress=gr.Progress(track_tqdm=True)):
            from adafuse.harness.evaluate import summarize
            ex = ex or Explorer()
            ex.trust_remote_code = bool(allow)
            try:
                rows = ex.evaluate(task_name, n, methods, names,
                                   {"tau": float(tau_v), "max_words": int(m_v), "branches": int(b_v),
                                    "normalize": NORMALIZE.get(norm, norm)}, dev)
                table = analysis.example_table(rows)
                labels = sorted({r["method"] for r in rows})
                members = analysis.members(rows)
                wrong = sum(analysis.WRONG_BUT_MEMBER in r["labels"] for r in table)
                first = next((r["line"] for r in table if analysis.WRONG_BUT_MEMBER in r["labels"]),
                             table[0]["line"] if table else None)
                return (ex, f"✓ {len(table)} examples × {len(labels)} methods on {task_name}; {wrong} where the "
                            f"ensemble is wrong and a member right (right: {analysis.rule(task_name)}; NLL averaged "
                            f"{norm}, as set under Model weights)",
                        pd.DataFrame(summarize(rows)), gr.update(value=analysis.ALL),
                        gr.update(value=pd.DataFrame(table), column_widths=analysis.column_widths(table)),
                        gr.update(value=ex.export_examples(), interactive=True),
                        gr.update(choices=labels, value=analysis.ensemble_method(labels) or labels[0]), first,
                        gr.update(choices=members, value=members[0] if members else None),
                        divergence_figure(rows, members[0]) if members else plots.empty_figure("no member ran"))
            except Exception as exc:  # noqa: BLE001
                return (ex, f"⚠️ **Error:** {html.escape(friendly(exc))}", *[gr.update()] * 8)
            finally:
                free_unused_memory()

        def on_filter(ex, show):
            ex = ex or Explorer()
            try:
                table = analysis.example_table(ex.eval_rows, show)
            except Exception as exc:  # noqa: BLE001
                return gr.update(), f"⚠️ {html.escape(friendly(exc))}"
            note = f"{len(table)} example(s): {show}" if ex.eval_rows else "no evaluation yet: press Run evaluation"
            frame = pd.DataFrame(table) if table else pd.DataFrame(columns=EXAMPLE_COLUMNS)
            return gr.update(value=frame, column_widths=analysis.column_widths(table) or None), note

        def on_pick_row(evt: gr.SelectData):
            row = evt.row_value or []
            return row[0] if row else gr.update()  # the line column

        def on_member(ex, member):
            ex = ex or Explorer()
            return divergence_figure(ex.eval_rows, member) if ex.eval_rows and member else gr.update()

        def on_open(ex, line, method):
            ex = ex or Explorer()
            keep = [gr.update()] * (4 + len(restorable))
            if ex.running:
                return (ex, *only_status("Wait for the Run to end (or ■ Cancel it) before opening an example."), *keep)
            try:
                methods = ex.open_example(int(line or 0), method)
                t = ex.trace
                found, focus, note = analysis.departures_of(t, ex.singles, methods)
                selected = focus.round if focus else None
                ex.panel = analysis.example_html(methods, method) + "".join(divergence_html(d) for d in found)
                out = render(ex, f"📂 example {int(line)} / {html.escape(method)}: {count(len(t.rounds), 'round')} · "
                                 + html.escape(focus.sentence() if focus else note), selected=selected)
                jump = selected if selected is not None else 0
                cand = (focus.member if focus and focus.member is not None else t.rounds[jump].chosen) if t.rounds \
                    else 0
                return (ex, *out, t.prompt, *restored(t.settings, len(t.models)), jump, cand,
                        gr.update(selected="pool" if focus else "compare"))
            except Exception as exc:  # noqa: BLE001
                return (ex, *_error(ex, exc), *keep)

        def on_prompt(text, mode_v, stop_v, proposed):
            """Raw mode: stop strings proposed from the prompt, unless the stop box holds the user's own (`USER`:
            the user edited it, even to empty); chat mode drops a proposal (a chat answer spans lines)."""
            if proposed == USER or (stop_v or "") != (proposed or ""):
                return gr.update(), proposed
            new = format_stops(propose_stops(text or "")) if mode_v == "raw" else ""
            return new, new

        def on_live(ex, *s):
            """A setting moved while a Run decodes: live ones apply from the next round (the run marks it), the
            others wait for the next decode (said at once)."""
            if ex is None or not ex.running or ex.decoding is None or ex.key is None:
                return
            try:
                cfg = _settings(*s)
                if cfg.gate and cfg.gate != ex.key[1].gate:  # a gate brings the averaging it was trained with
                    cfg = replace(cfg, normalize=load_gate(cfg.gate).normalize)
                fixed, waits = ex.offer_live(cfg)
            except Exception as exc:  # noqa: BLE001
                gr.Warning(friendly(exc))
                return
            if fixed:
                gr.Warning(f"{', '.join(fixed)} cannot change during a Run: it applies to the next decode")
            if waits:
                gr.Info("applies from the next round (marked on the Margins chart)", duration=3)

        refresh = [loaded_df, unload_pick]
        hidden = dict(api_visibility="private")  # only /decode and /models are the app's API (app/api.py)
        models.change(weight_sliders, [models], weights, show_progress="hidden", **hidden)
        gate.change(gate_normalize, [gate, normalize], normalize, show_progress="hidden", **hidden)
        demo.load(loaded_views, None, refresh, show_progress="hidden", **hidden)
        demo.load(None, None, None, js=SHORTCUTS, **hidden)
        load_btn.click(on_load, [models, device, trust], [load_status], **hidden).then(
            loaded_views, None, refresh, show_progress="hidden", **hidden)
        unload_btn.click(on_unload, [unload_pick], [load_status, *refresh], **hidden)
        eval_btn.click(on_eval, [state, eval_task, eval_n, eval_methods, models, device, trust, tau, max_words,
                                 branches, normalize],
                       [state, eval_status, eval_summary, eval_filter, eval_table, eval_csv, open_method, open_line,
                        div_member, div_plot],
                       concurrency_limit=1, concurrency_id="eval", **hidden).then(loaded_views, None, refresh,
                                                                                 show_progress="hidden", **hidden)
        eval_filter.input(on_filter, [state, eval_filter], [eval_table, eval_status], **hidden)
        eval_table.select(on_pick_row, None, [open_line], show_progress="hidden", **hidden)
        div_member.input(on_member, [state, div_member], [div_plot], **hidden)
        open_btn.click(on_open, [state, open_line, open_method],
                       [state, *outputs, prompt, *restorable, tok_round, tok_cand, view_tabs], **hidden).then(
            None, js=TO_VIEWS, **hidden)
        proposed = gr.State("")  # the stop strings last proposed from the prompt (USER: the box is the user's own)
        for trigger in (prompt.input, mode.input):
            trigger(on_prompt, [prompt, mode, stop, proposed], [stop, proposed], show_progress="hidden",
                    trigger_mode="always_last", **hidden)
        stop.input(lambda: USER, None, [proposed], show_progress="hidden", **hidden)
        # a prompt already in the box when the page loads (restored by the browser) gets its proposal too
        demo.load(on_prompt, [prompt, mode, stop, proposed], [stop, proposed], show_progress="hidden", **hidden)
        for c in (tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens, mode, stop,
                  system, thinking, speculate, normalize, gate, *weights):
            c.input(on_live, [state, *settings], None, show_progress="hidden", trigger_mode="always_last",
                    concurrency_limit=None, **hidden)
        run_btn.click(None, js=TO_ANSWER, **hidden)
        # Run and Step first take the stop strings proposed from the prompt as it is now, however it got there (typed,
        # pasted, restored by the browser): the decode never starts before the proposal it would have had
        propose = dict(fn=on_prompt, inputs=[prompt, mode, stop, proposed], outputs=[stop, proposed], queue=False,
                       show_progress="hidden", **hidden)
        run_btn.click(**propose).then(
            on_run, [state, models, device, trust, prompt, compare, others, choice, *settings], [state, *outputs],
            show_progress="hidden", concurrency_limit=DECODE_QUEUE, concurrency_id="decode", **hidden)
        step_btn.click(**propose).then(
            on_step, [state, models, device, trust, prompt, choice, *settings], [state, *outputs],
            concurrency_limit=DECODE_QUEUE, concurrency_id="decode", **hidden)
        cancel_btn.click(on_cancel, [state], [state, *outputs], **hidden)

        round_sel.input(on_round, [state, round_sel], [pool_plot, picks_df], show_progress="hidden",  # keys too
                        **hidden)
        upload.upload(on_upload, [state, upload], [state, *outputs], **hidden)
        branch_btn.click(on_branch, [state, branch_round, branch_cand], [state, *outputs],
                 concurrency_limit=DECODE_QUEUE, concurrency_id="decode", **hidden)
        # Reset does not cancel the running handler through Gradio: an update that handler had already sent could
        # then reach the page after Reset's own and stay there. The handler sees `replaced_by` at its next round and
        # its every later update shows the fresh session, so the last word is always the Reset's
        reset_btn.click(on_reset, [state], [state, *outputs], **hidden)
        tok_btn.click(on_tokens, [state, tok_round, tok_cand], [tok_view], concurrency_limit=DECODE_QUEUE,
                      concurrency_id="decode", **hidden)
    return demo
