"""AdaFuse Explorer layout and event wiring (layout first, wiring at the bottom)."""
from __future__ import annotations

import html

import gradio as gr

from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, DecodeConfig
from adafuse.report import candidate_label

from . import plots
from .controller import (COMPARE_METHODS, EVAL_METHODS, Explorer, device_choices, disagreements, friendly,
                         load_examples, loaded_frame, parse_stops, stop_note, unload)

CSS = """
.af-out {font-family: ui-serif, Georgia, serif; font-size: 1.08rem; line-height: 1.9; padding: 12px 14px;
         border: 1px solid #e5e7eb; border-radius: 10px; background: #fff; min-height: 64px; white-space: normal}
.af-span {border-radius: 4px; padding: 1px 2px; margin: 0 1px; cursor: help}
.af-legend {font-size: .85rem; color: #4b5563; margin-top: 6px}
.af-empty {color: #6b7280; padding: 10px}
.af-grid {display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: 12px}
.af-col {border: 1px solid #e5e7eb; border-radius: 10px; padding: 10px; background: #fafafa}
.af-col pre {white-space: pre-wrap; font-family: ui-serif, Georgia, serif; font-size: 1rem; margin: 6px 0 0}
.af-meta {font-size: .8rem; color: #6b7280}
#af-status {min-height: 1.5em}
"""

INTRO = """# AdaFuse Explorer
Several language models write **one answer together, word by word**. At each word start every model checks its
confidence margin Δ (top-1 minus top-2 probability): confident models **commit** up to M words, unsure ones
**explore** B distinct candidates; all candidates are scored by every model (length-normalized NLL) and the lowest
average wins. Hover a span to see its round."""


def _settings(tau, max_words, branches, diversity, max_new_words, max_new_tokens, mode, stop) -> DecodeConfig:
    return DecodeConfig(tau=float(tau), max_words=int(max_words), branches=int(branches), diversity=bool(diversity),
                        max_new_words=int(max_new_words), max_new_tokens=int(max_new_tokens), mode=mode,
                        stop=parse_stops(stop))


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
    )


def _error(ex: Explorer, exc: BaseException):
    msg = friendly(exc)
    gr.Warning(msg)
    return render(ex, f"⚠️ **Error:** {html.escape(msg)}", loaded=True)


def build_demo() -> gr.Blocks:
    examples = load_examples()
    with gr.Blocks(title="AdaFuse Explorer") as demo:
        state = gr.State(None)
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                models = gr.Dropdown(choices=list(BUNDLED) + list(PAPER_MODELS), value=list(DEFAULT_PAIR),
                                     multiselect=True, allow_custom_value=True, max_choices=4,
                                     label="Base models (2–4; type any HF id or local path)", elem_id="af-models",
                                     info="Place a model by typing `MODEL@cuda:1`, `MODEL@cpu` or "
                                          "`MODEL@auto,bfloat16` (auto: spread over every GPU; dtype float32, "
                                          "bfloat16 or float16); a model on a vLLM server: "
                                          "`vllm:http://HOST:PORT/v1#SERVED-NAME`.")
                device = gr.Dropdown(device_choices(), value="default", label="Device for all models",
                                     info="Added to each model without its own @DEVICE; default: CUDA when "
                                          "present, else CPU.", elem_id="af-device")
                load_btn = gr.Button("Load models", size="sm")
                load_status = gr.Markdown("Bundled pair preselected; models load on first use.",
                                          elem_id="af-load-status")
                loaded_df = gr.Dataframe(loaded_frame([]), label="Loaded models", interactive=False,
                                         elem_id="af-loaded")
                with gr.Row():
                    unload_pick = gr.Dropdown([], label="Loaded model", scale=2, elem_id="af-unload-pick")
                    unload_btn = gr.Button("Unload", size="sm", scale=1, elem_id="af-unload")
                tau = gr.Slider(0, 1, value=0.7, step=0.05, label="τΔ: commit when Δ ≥ τΔ")
                max_words = gr.Slider(1, 5, value=3, step=1, label="M: most words per confident round")
                branches = gr.Slider(1, 8, value=3, step=1, label="B: candidates when unsure")
                diversity = gr.Checkbox(True, label="Diverse exploration (off = beam search)")
                max_new_words = gr.Slider(1, 200, value=40, step=1, label="Max new words")
                max_new_tokens = gr.Slider(16, 2048, value=1024, step=16, elem_id="af-max-tokens",
                                           label="Max new tokens (each model's tokenizer; the larger count binds)")
                mode = gr.Radio(["raw", "chat"], value="raw", label="Prompt mode")
                stop = gr.Textbox(value="", lines=2, label="Stop strings (one per line, \\n for newline)")
                compare = gr.Checkbox(True, label="Also run each model alone (greedy)")
                others = gr.CheckboxGroup(list(COMPARE_METHODS), value=[], label="Also decode with (side by side)")
            with gr.Column(scale=2):
                prompt = gr.Textbox(lines=7, label="Prompt", elem_id="af-prompt",
                                    placeholder="Type a prompt or pick an example below")
                with gr.Row():
                    run_btn = gr.Button("▶ Run", variant="primary", elem_id="af-run")
                    step_btn = gr.Button("Step ›", elem_id="af-step")
                    cancel_btn = gr.Button("■ Cancel", variant="stop", elem_id="af-cancel")
                    reset_btn = gr.Button("↺ Reset", elem_id="af-reset")
                choice = gr.Dropdown(choices=[], label="Step mode: candidate to commit next (default: the winner)",
                                     interactive=False, elem_id="af-choice")
                status = gr.Markdown("", elem_id="af-status")
                fused = gr.HTML(plots.fused_html(None), elem_id="af-fused")
                gr.Examples(examples=[[e["prompt"], e["mode"], e["stop"], e["max_words"]] for e in examples],
                            inputs=[prompt, mode, stop, max_new_words],
                            example_labels=[e["label"] for e in examples], label="Examples")
        with gr.Tabs():
            with gr.Tab("Fused vs single models", id="compare"):
                compare_view = gr.HTML(plots.compare_html(None, None), elem_id="af-compare")
            with gr.Tab("Confidence margins", id="margins"):
                margins_plot = gr.Plot(plots.margins_figure(None), elem_id="af-margins")
            with gr.Tab("Candidate pool", id="pool"):
                round_sel = gr.Slider(0, 1, value=0, step=1, label="Round", interactive=False, elem_id="af-round")
                pool_plot = gr.Plot(plots.pool_figure(None), elem_id="af-pool")
            with gr.Tab("Words per round", id="wpr"):
                wpr_plot = gr.Plot(plots.words_per_round_figure(None), elem_id="af-wpr")
            with gr.Tab("Rounds & cost", id="rounds"):
                rounds_df = gr.Dataframe(plots.rounds_frame(None), label="Rounds", elem_id="af-rounds", wrap=True)
                cost_plot = gr.Plot(plots.cost_figure(None), elem_id="af-cost")
                cost_df = gr.Dataframe(plots.cost_frame(None), label="Forward passes, tokens fed, seconds")
            with gr.Tab("Evaluate", id="eval"):
                gr.Markdown("Run a small batch of a benchmark task (from `../shared/data`) with several methods, then "
                            "open any example's trace in the views above.")
                with gr.Row():
                    from adafuse.harness.tasks import TASKS
                    eval_task = gr.Dropdown(list(TASKS), value="triviaqa", label="Task")
                    eval_n = gr.Slider(1, 20, value=3, step=1, label="Examples")
                    eval_methods = gr.CheckboxGroup(list(EVAL_METHODS), value=["adafuse", "greedy"], label="Methods")
                eval_btn = gr.Button("Run evaluation", elem_id="af-eval-run")
                eval_status = gr.Markdown("", elem_id="af-eval-status")
                eval_summary = gr.Dataframe(label="Summary", elem_id="af-eval-summary", wrap=True)
                eval_diff = gr.Dataframe(label="Where the ensemble and a single model disagree", wrap=True,
                                         elem_id="af-eval-diff")
                with gr.Row():
                    open_line = gr.Number(label="Example (line)", precision=0)
                    open_method = gr.Dropdown([], label="Method", allow_custom_value=True)
                    open_btn = gr.Button("Open in the explorer views")
            with gr.Tab("Export / load trace", id="io"):
                download = gr.DownloadButton("⬇ Download trace (JSON)", value=None, interactive=False,
                                             elem_id="af-download")
                upload = gr.File(label="Load a saved trace (browse it without any model)", file_types=[".json"],
                                 elem_id="af-upload")

        outputs = [fused, compare_view, margins_plot, pool_plot, wpr_plot, rounds_df, cost_df, cost_plot, round_sel,
                   choice, status, download, loaded_df, unload_pick]
        settings = [tau, max_words, branches, diversity, max_new_words, max_new_tokens, mode, stop]

        # ---- wiring ----
        def on_load(names, dev, progress=gr.Progress()):
            try:
                progress(0, desc="loading models (the first load of a GGUF converts it: a minute or two)")
                return Explorer().load(names, dev)
            except Exception as exc:  # noqa: BLE001 - shown to the user, app keeps serving
                return f"⚠️ {friendly(exc)}"

        def on_unload(name):
            try:
                msg = unload(name)
            except Exception as exc:  # noqa: BLE001
                msg = f"⚠️ {friendly(exc)}"
            return (msg, *loaded_views())

        def on_run(ex, names, dev, prompt_text, want_singles, other_methods, *s):
            ex = ex or Explorer()
            try:
                cfg = _settings(*s)
                yield (ex, *render(ex, "… loading models and reading the prompt", export=False))
                d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)
                yield (ex, *render(ex, "… decoding", export=False, loaded=True))
                while not d.done:
                    r = d.step()
                    yield (ex, *render(ex, f"… round {r.index + 1} · {d.trace.words} words", export=False))
                for label in ex.run_others(names, cfg, prompt_text, other_methods, dev):
                    yield (ex, *render(ex, f"… {label} done", export=False))
                if want_singles:
                    for name in ex.run_singles(names, cfg, prompt_text, dev):
                        yield (ex, *render(ex, f"… {name} alone done", export=False))
                yield (ex, *render(ex, f"✓ done: {d.trace.words} words in {len(d.trace.rounds)} rounds "
                                       f"({d.trace.seconds:.1f}s), {stop_note(d.trace)}", loaded=True))
            except Exception as exc:  # noqa: BLE001
                yield (ex, *_error(ex, exc))

        def on_step(ex, names, dev, prompt_text, picked, *s):
            ex = ex or Explorer()
            try:
                cfg = _settings(*s)
                before = ex.decoding
                d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)  # same settings: the same decode
                fresh = d is not before
                if not fresh and d.pending is not None:
                    r = d.commit(int(picked) if picked is not None else None)
                    note = f"committed round {r.index}" + (" (your override)" if r.overridden else "")
                else:
                    note = "started"
                if not d.done:
                    p = d.propose()
                    note += f"; round {p.index} decided — pick a candidate or press Step to accept the winner"
                else:
                    note += f"; finished ({stop_note(d.trace)})"
                return (ex, *render(ex, f"› {note}", loaded=True))
            except Exception as exc:  # noqa: BLE001
                return (ex, *_error(ex, exc))

        def on_cancel(ex):
            ex = ex or Explorer()
            if ex.decoding is not None:
                ex.decoding.cancel()
            return (ex, *render(ex, "■ cancelled between rounds"))

        def on_reset():
            ex = Explorer()
            return (ex, *render(ex, "↺ reset"))

        def on_round(ex, idx):
            ex = ex or Explorer()
            return plots.pool_figure(ex.trace, int(idx), None)

        def on_upload(ex, file):
            ex = ex or Explorer()
            if file is None:
                return (ex, *render(ex))
            try:
                t = ex.load_trace(file if isinstance(file, str) else file.name)
                return (ex, *render(ex, f"📂 loaded a trace of {len(t.rounds)} rounds ({', '.join(t.models)})"))
            except Exception as exc:  # noqa: BLE001
                return (ex, *_error(ex, exc))

        def on_eval(ex, task_name, n, methods, names, dev, tau_v, m_v, b_v, progress=gr.Progress(track_tqdm=True)):
            import pandas as pd
            from adafuse.harness.evaluate import summarize
            ex = ex or Explorer()
            try:
                rows = ex.evaluate(task_name, n, methods, names,
                                   {"tau": float(tau_v), "max_words": int(m_v), "branches": int(b_v)}, dev)
                diff = disagreements(rows)
                labels = sorted({r["method"] for r in rows})
                return (ex, f"✓ {len(rows)} runs on {task_name}; {len(diff)} disagreement(s)",
                        pd.DataFrame(summarize(rows)), pd.DataFrame(diff or [{"line": None}]),
                        gr.update(choices=labels, value="adafuse" if "adafuse" in labels else labels[0]),
                        diff[0]["line"] if diff else (rows[0]["line"] if rows else None))
            except Exception as exc:  # noqa: BLE001
                return (ex, f"⚠️ **Error:** {html.escape(friendly(exc))}", gr.update(), gr.update(), gr.update(),
                        gr.update())

        def on_open(ex, line, method):
            ex = ex or Explorer()
            try:
                t = ex.open_example(int(line or 0), method)
                return (ex, *render(ex, f"📂 example {int(line)} / {method}: {len(t.rounds)} rounds"))
            except Exception as exc:  # noqa: BLE001
                return (ex, *_error(ex, exc))

        refresh = [loaded_df, unload_pick]
        demo.load(loaded_views, None, refresh, show_progress="hidden")
        load_btn.click(on_load, [models, device], [load_status]).then(loaded_views, None, refresh,
                                                                      show_progress="hidden")
        unload_btn.click(on_unload, [unload_pick], [load_status, *refresh])
        eval_btn.click(on_eval, [state, eval_task, eval_n, eval_methods, models, device, tau, max_words, branches],
                       [state, eval_status, eval_summary, eval_diff, open_method, open_line],
                       concurrency_limit=1, concurrency_id="eval").then(loaded_views, None, refresh,
                                                                       show_progress="hidden")
        open_btn.click(on_open, [state, open_line, open_method], [state, *outputs])
        run_evt = run_btn.click(on_run, [state, models, device, prompt, compare, others, *settings], [state, *outputs],
                                concurrency_limit=2, concurrency_id="decode")
        step_evt = step_btn.click(on_step, [state, models, device, prompt, choice, *settings], [state, *outputs],
                                  concurrency_limit=2, concurrency_id="decode")
        cancel_btn.click(on_cancel, [state], [state, *outputs], cancels=[run_evt, step_evt])
        reset_btn.click(on_reset, None, [state, *outputs], cancels=[run_evt, step_evt])
        round_sel.release(on_round, [state, round_sel], [pool_plot])
        upload.upload(on_upload, [state, upload], [state, *outputs])
    return demo
