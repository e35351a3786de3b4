"""AdaFuse Explorer layout and event wiring (layout first, wiring at the bottom)."""
from __future__ import annotations

import html

import gradio as gr
import pandas as pd

from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, DecodeConfig
from adafuse.methods import MAX_MODELS
from adafuse.errors import AdafuseError, ConfigError
from .explain_html import token_view_html, tree_html
from adafuse.gate import load_gate
from adafuse.harness.tasks import TASKS, data_source
from adafuse.report import candidate_label

from . import api, plots
from .gpu import gpu
from .controller import (ASSETS, COMPARE_METHODS, EVAL_METHODS, Explorer, device_choices, disagreements, friendly,
                         load_examples, loaded_frame, parse_stops, remote_code_allowed, stop_note, unload)

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
"""

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
average wins. Hover a span (or Tab to it) to see its round. **Ctrl+Enter** runs, **Ctrl+Shift+Enter** steps."""


THINKING = {"template default": None, "on": True, "off": False}


def gate_choices() -> list[tuple[str, str]]:
    """The shipped learned gates (assets/gates/*.json), labelled by the models and tasks they were trained for."""
    out = [("none (the weights below)", "")]
    for path in sorted(GATES.glob("*.json")):
        try:
            g = load_gate(path)
        except AdafuseError:
            continue
        tasks = ", ".join(g.trained.get("tasks", [])) or "?"
        per = " · NLL per word" if g.normalize == "word" else ""
        out.append((f"{path.stem}: {' + '.join(g.models)} · trained on {tasks}{per}", str(path)))
    return out


# the evaluation tables' headers before a run (Gradio shows "1 2 3" for a table without columns)
EVAL_SUMMARY_COLUMNS = ["task", "method", "n", "score", "sec/example"]
DISAGREE_COLUMNS = ["line", "kind", "question", "adafuse", "gold"]

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
    live = ex.running or (ex.decoding is not None and not ex.decoding.done)
    return (
        plots.fused_html(t, pending),
        plots.compare_html(t, ex.singles, ex.others),
        plots.margins_figure(t),
        plots.pool_figure(t, selected, pending),
        plots.words_per_round_figure(t),
        plots.rounds_frame(t),
        plots.cost_frame(t, ex.singles),
        plots.cost_figure(t, ex.singles),
        gr.update(maximum=max(1, n - 1), value=max(0, selected), interactive=n > 1),
        gr.update(choices=choices, value=pending.winner if pending is not None else None,
                  interactive=bool(choices)),
        status,
        gr.update(value=ex.export(), interactive=t is not None) if export else gr.update(),
        *loaded_views(loaded),
        gr.update(interactive=live),
        tree_html(t, ex.branches),
        plots.selection_frame(t, selected),
    )


STATUS_AT = 10  # where the status sits in render()'s tuple


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


def _confirm(ex: Explorer, what: str, button: str) -> str:
    n = len(ex.trace.rounds) if ex.trace else 0
    return (f"⚠️ You changed {html.escape(what)} since this decode began ({n} round(s) so far). Press **{button}** "
            f"again to drop them and start a new decode, or change it back to go on where you are.")


def _example_note(prompt_text, mode, stop, max_words) -> str:
    stops = ", ".join(repr(x) for x in parse_stops(stop)) or "none"
    return (f"Example loaded: prompt mode **{mode}**, stop strings {html.escape(stops)}, **Max new words set to "
            f"{int(max_words)}** (settings panel). Press ▶ Run or Step ›.")


def build_demo() -> gr.Blocks:
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
        tau = gr.Slider(0, 1, value=0.7, step=0.05, label="τΔ: commit when Δ ≥ τΔ", render=False, elem_id="af-tau")
        max_words = gr.Slider(1, 5, value=3, step=1, label="M: most words per confident round", render=False)
        branches = gr.Slider(1, 8, value=3, step=1, label="B: candidates when unsure", render=False)
        diversity = gr.Checkbox(True, label="Diverse exploration (off = beam search)", render=False)
        exploration = gr.Radio(["surface", "embedding"], value="surface", render=False, elem_id="af-exploration",
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
        stop = gr.Textbox(value="", lines=2, label="Stop strings (one per line, \\n for newline)", render=False)
        system = gr.Textbox(value="", lines=2, label="System prompt (chat mode)", render=False, elem_id="af-system",
                            info="Put first as a system message where the chat template has that role, else at the "
                                 "start of the user message; raw mode ignores it (the trace says so).")
        thinking = gr.Radio(list(THINKING), value="template default", render=False, elem_id="af-thinking",
                            label="Thinking (chat templates with a switch, e.g. Qwen3)",
                            info="Models whose template has no switch ignore it; the trace notes which.")
        with gr.Row():
            with gr.Column(scale=2, min_width=320, elem_id="af-main"):  # first: on a phone the prompt comes first
                prompt = gr.Textbox(lines=5, label="Prompt", elem_id="af-prompt",
                                    placeholder="Type a prompt or pick an example below")
                with gr.Row():
                    run_btn = gr.Button("▶ Run", variant="primary", elem_id="af-run")
                    step_btn = gr.Button("Step ›", elem_id="af-step")
                    cancel_btn = gr.Button("■ Cancel", variant="stop", elem_id="af-cancel", interactive=False)
                    reset_btn = gr.Button("↺ Reset", elem_id="af-reset")
                status = gr.Markdown("", elem_id="af-status")
                gr.Examples(examples=[[e["prompt"], e["mode"], e["stop"], e["max_words"]] for e in examples],
                            inputs=[prompt, mode, stop, max_new_words], outputs=[status], fn=_example_note,
                            run_on_click=True, cache_examples=False,
                            example_labels=[e["label"] for e in examples], label="Examples")
                choice = gr.Dropdown(choices=[], label="Step mode: candidate to commit next (default: the winner)",
                                     interactive=False, elem_id="af-choice")
                fused = gr.HTML(plots.fused_html(None), elem_id="af-fused")
                with gr.Tabs():
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
                    normalize = gr.Radio(list(NORMALIZE), value=next(iter(NORMALIZE)), elem_id="af-normalize",
                                         label="Each model's NLL of a candidate, averaged",
                                         info="Per token (the paper) lets a long word with an unlikely first token "
                                              "and a near-certain tail beat a likelier short word; per word counts "
                                              "its whole NLL (the end of the answer is one word).")
                    gate = gr.Dropdown(gate_choices(), value="", label="Learned gate (per-round weights)",
                                       info="Weights each round from what the models show (margin, entropy, "
                                            "confidence, own NLL, position); replaces the sliders. Trained for "
                                            "the models it names and sets the NLL averaging it learned with.",
                                       elem_id="af-gate")
                with gr.Accordion("Chat mode: system prompt and thinking", open=False):
                    system.render()
                    thinking.render()
                speculate = gr.Checkbox(False, elem_id="af-speculate",
                                        label="Speculative proposals (same decode, fewer forward passes)",
                                        info="A confident model first checks the spans proposed before it this "
                                             "round in one forward and takes their tokens where it would have "
                                             "written them; the cost view counts drafts, accepted tokens, "
                                             "forwards saved.")
                compare = gr.Checkbox(True, label="Also run each model alone (greedy)")
                others = gr.CheckboxGroup(list(COMPARE_METHODS), value=[], label="Also decode with (side by side)")
                with gr.Accordion("Loaded models", open=True):
                    loaded_df = gr.Dataframe(loaded_frame([]), label="Loaded models", interactive=False,
                                             elem_id="af-loaded", wrap=True)  # wrapped: every column in a narrow column
                    with gr.Row():
                        unload_pick = gr.Dropdown([], label="Loaded model", scale=2, elem_id="af-unload-pick")
                        unload_btn = gr.Button("Unload", size="sm", scale=1, elem_id="af-unload")

        with gr.Tabs():  # work on many prompts, and traces kept as files: full width below
            with gr.Tab("Evaluate", id="eval"):
                gr.Markdown("Run a small batch of a benchmark task with several methods, then open any "
                            f"example's trace in the views above. Data: {data_source()}.")
                with gr.Row():
                    eval_task = gr.Dropdown(list(TASKS), value="triviaqa", label="Task")
                    eval_n = gr.Slider(1, 20, value=3, step=1, label="Examples")
                    eval_methods = gr.CheckboxGroup(list(EVAL_METHODS), value=["adafuse", "greedy"],
                                                    label="Methods")
                eval_btn = gr.Button("Run evaluation", elem_id="af-eval-run")
                eval_status = gr.Markdown("", elem_id="af-eval-status")
                eval_summary = gr.Dataframe(pd.DataFrame(columns=EVAL_SUMMARY_COLUMNS), label="Summary",
                                            elem_id="af-eval-summary", wrap=True)
                eval_diff = gr.Dataframe(pd.DataFrame(columns=DISAGREE_COLUMNS), wrap=True, elem_id="af-eval-diff",
                                         label="Where the ensemble and a single model disagree")
                with gr.Row():
                    open_line = gr.Number(label="Example (line)", precision=0)
                    open_method = gr.Dropdown([], label="Method", allow_custom_value=True)
                    open_btn = gr.Button("Open in the explorer views")
            with gr.Tab("Export / load trace", id="io"):
                download = gr.DownloadButton("⬇ Download trace (JSON)", value=None, interactive=False,
                                             elem_id="af-download")
                upload = gr.UploadButton("📂 Load a saved trace (.json; browse it without any model)",
                                         file_types=[".json"], elem_id="af-upload")

        outputs = [fused, compare_view, margins_plot, pool_plot, wpr_plot, rounds_df, cost_df, cost_plot, round_sel,
                   choice, status, download, loaded_df, unload_pick, cancel_btn, tree_view, picks_df]
        assert outputs[STATUS_AT] is status
        settings = [models, tau, max_words, branches, diversity, exploration, lam, max_new_words, max_new_tokens,
                    mode, stop, system, thinking, speculate, normalize, gate, *weights]
        api.register()  # /decode and /models for gradio_client

        # ---- wiring ----
        @gpu
        def on_load(names, dev, allow, progress=gr.Progress()):
            try:
                progress(0, desc="loading models (the first load of a GGUF converts it: a minute or two)")
                return Explorer(trust_remote_code=bool(allow)).load(names, dev)
            except Exception as exc:  # noqa: BLE001 - shown to the user, app keeps serving
                return f"⚠️ {friendly(exc)}"

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

        def on_run(ex, names, dev, allow, prompt_text, want_singles, other_methods, picked, *s):
            ex = ex or Explorer()
            ex.trust_remote_code = bool(allow)
            if ex.running:
                yield (ex, *only_status("A decode is already running in this session: wait, or press ■ Cancel."))
                return
            try:
                cfg = _settings(*s)
                kind, what = ex.plan(names, cfg, prompt_text, dev)
                if kind == "confirm":
                    yield (ex, *render(ex, _confirm(ex, what, "▶ Run")))
                    return
                ex.running, ex.cancel_requested = True, False
                yield shown(ex, "… loading models and reading the prompt", export=False)
                before = ex.decoding
                d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)
                changed = f" ({what} from round {d.trace.changes[-1]['from_round']})" if what else ""
                if d is before and d.pending is not None and picked is not None:  # the step mode's pick goes first
                    r = d.commit(int(picked))
                    changed += f" (round {r.index}: " + ("your pick" if r.overridden else "the winner") + ")"
                yield shown(ex, f"… decoding{changed}", export=False, loaded=True)
                while not d.done and not ex.cancel_requested:
                    r = d.step()
                    yield shown(ex, f"… round {r.index + 1} · {d.trace.words} words", export=False)
                if not ex.cancel_requested:
                    for label in ex.run_others(names, cfg, prompt_text, other_methods, dev):
                        yield shown(ex, f"… {label} done", export=False)
                if want_singles and not ex.cancel_requested:
                    for name in ex.run_singles(names, cfg, prompt_text, dev):
                        yield shown(ex, f"… {name} alone done", export=False)
                ex.running = False
                if ex.cancel_requested and d.trace.stop_reason in (None, "cancelled"):
                    d.cancel()
                    yield shown(ex, f"■ cancelled after round {len(d.trace.rounds)}: the "
                                    f"{d.trace.words} words so far are kept", loaded=True)
                    return
                if ex.cancel_requested:  # the fused decode had finished: only the comparisons were stopped
                    yield shown(ex, f"■ cancelled the comparisons; the fused decode had finished: "
                                    f"{d.trace.words} words, {stop_note(d.trace)}", loaded=True)
                    return
                yield shown(ex, f"✓ done: {d.trace.words} words in {len(d.trace.rounds)} rounds "
                                f"({d.trace.seconds:.1f}s), {stop_note(d.trace)}", loaded=True)
            except Exception as exc:  # noqa: BLE001
                ex.running = False
                yield shown(ex, "") if ex.replaced_by else (ex, *_error(ex, exc))
            finally:  # also when Reset closes this run
                ex.running = False

        @gpu
        def on_step(ex, names, dev, allow, prompt_text, picked, *s):
            ex = ex or Explorer()
            ex.trust_remote_code = bool(allow)
            if ex.running:  # a toast: the running decode keeps writing the status line
                msg = "Step is not available while ▶ Run is decoding: wait for it to end, or press ■ Cancel first."
                gr.Warning(msg)
                return (ex, *only_status(msg))
            ex.running, ex.cancel_requested = True, False  # Run, Branch, loading wait; Cancel waits for the phase
            try:
                cfg = _settings(*s)
                kind, what = ex.plan(names, cfg, prompt_text, dev)
                if kind == "confirm":
                    return (ex, *render(ex, _confirm(ex, what, "Step ›")))
                before = ex.decoding
                d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)
                fresh = d is not before
                if not fresh and d.pending is not None:
                    r = d.commit(int(picked) if picked is not None else None)
                    note = f"committed round {r.index}" + (" (your override)" if r.overridden else "")
                else:
                    note = "started"
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
                return (ex, *_error(ex, exc))
            finally:
                ex.running = False

        def on_cancel(ex):
            ex = ex or Explorer()
            if ex.request_cancel():  # the run ends itself after the round under way and says so
                gr.Info("Cancelling after the round under way", duration=4)
                return (ex, *only_status())
            return (ex, *render(ex, "■ cancelled between rounds" if ex.trace else "nothing is running"))

        @gpu
        def on_branch(ex, r_idx, c_idx):
            ex = ex or Explorer()
            if ex.running:
                yield (ex, *only_status("Wait for the Run to end (or ■ Cancel it) before branching."))
                return
            try:
                ex.running, ex.cancel_requested = True, False
                yield (ex, *render(ex, f"… branching from round {r_idx}: deciding the rounds before it again",
                                   export=False))
                for label, d in ex.branch(r_idx, c_idx):
                    yield shown(ex, f"… {html.escape(label)}: round {len(d.trace.rounds)} · {d.trace.words} words",
                                export=False)
                ex.running = False
                yield shown(ex, f"✓ {html.escape(label)}: {d.trace.words} words ({stop_note(d.trace)}); see it "
                                "beside the original under *Fused vs alone*", loaded=True)
            except Exception as exc:  # noqa: BLE001
                ex.running = False
                yield (ex, *_error(ex, exc))
            finally:
                ex.running = False

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
        def on_eval(ex, task_name, n, methods, names, dev, allow, tau_v, m_v, b_v,
                    progress=gr.Progress(track_tqdm=True)):
            from adafuse.harness.evaluate import summarize
            ex = ex or Explorer()
            ex.trust_remote_code = bool(allow)
            try:
                rows = ex.evaluate(task_name, n, methods, names,
                                   {"tau": float(tau_v), "max_words": int(m_v), "branches": int(b_v)}, dev)
                diff = disagreements(rows)
                labels = sorted({r["method"] for r in rows})
                return (ex, f"✓ {len(rows)} runs on {task_name}; {len(diff)} disagreement(s)",
                        pd.DataFrame(summarize(rows)),
                        pd.DataFrame(diff) if diff else pd.DataFrame([{"line": "", "kind": "none: the ensemble and "
                                                                       "every single model agree on each example"}]),
                        gr.update(choices=labels, value="adafuse" if "adafuse" in labels else labels[0]),
                        diff[0]["line"] if diff else (rows[0]["line"] if rows else None))
            except Exception as exc:  # noqa: BLE001
                return (ex, f"⚠️ **Error:** {html.escape(friendly(exc))}", gr.update(), gr.update(), gr.update(),
                        gr.update())

        def on_open(ex, line, method):
            ex = ex or Explorer()
            if ex.running:
                return (ex, *only_status("Wait for the Run to end (or ■ Cancel it) before opening an example."))
            try:
                t = ex.open_example(int(line or 0), method)
                return (ex, *render(ex, f"📂 example {int(line)} / {method}: {len(t.rounds)} rounds"))
            except Exception as exc:  # noqa: BLE001
                return (ex, *_error(ex, exc))

        refresh = [loaded_df, unload_pick]
        models.change(weight_sliders, [models], weights, show_progress="hidden")
        gate.change(gate_normalize, [gate, normalize], normalize, show_progress="hidden")
        demo.load(loaded_views, None, refresh, show_progress="hidden")
        demo.load(None, None, None, js=SHORTCUTS)
        load_btn.click(on_load, [models, device, trust], [load_status]).then(loaded_views, None, refresh,
                                                                      show_progress="hidden")
        unload_btn.click(on_unload, [unload_pick], [load_status, *refresh])
        eval_btn.click(on_eval, [state, eval_task, eval_n, eval_methods, models, device, trust, tau, max_words,
                                 branches],
                       [state, eval_status, eval_summary, eval_diff, open_method, open_line],
                       concurrency_limit=1, concurrency_id="eval").then(loaded_views, None, refresh,
                                                                       show_progress="hidden")
        open_btn.click(on_open, [state, open_line, open_method], [state, *outputs])
        run_evt = run_btn.click(on_run, [state, models, device, trust, prompt, compare, others, choice, *settings],
                                [state, *outputs],
                                concurrency_limit=2, concurrency_id="decode")
        step_evt = step_btn.click(on_step, [state, models, device, trust, prompt, choice, *settings],
                                  [state, *outputs],
                                  concurrency_limit=2, concurrency_id="decode")
        cancel_btn.click(on_cancel, [state], [state, *outputs])

        round_sel.input(on_round, [state, round_sel], [pool_plot, picks_df], show_progress="hidden")  # keys too
        upload.upload(on_upload, [state, upload], [state, *outputs])
        branch_evt = branch_btn.click(on_branch, [state, branch_round, branch_cand], [state, *outputs],
                         concurrency_limit=2, concurrency_id="decode")
        reset_btn.click(on_reset, [state], [state, *outputs], cancels=[run_evt, step_evt, branch_evt])
        tok_btn.click(on_tokens, [state, tok_round, tok_cand], [tok_view], concurrency_limit=2,
                      concurrency_id="decode")
    return demo
