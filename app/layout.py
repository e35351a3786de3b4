"""The page's layout, one function per part (the run panel, the views, the settings, Evaluate, Export / load): each
makes its components and keeps them on `ui`, the namespace ui.py wires the handlers to."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pandas as pd

from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, DecodeConfig
from adafuse.harness.tasks import TASKS, data_source
from adafuse.methods import BASELINE, MAX_MODELS

from . import analysis, plots, teach
from .answers import ANSWERS, MAX_ANSWER_CHARS, QUESTION, no_figure, no_frame
from .controller import COMPARE_METHODS, EVAL_METHODS, device_choices, loaded_frame, remote_code_allowed
from .explain_html import tree_html
from .sliders import (BRANCHES, EXAMPLES, LAMBDA, MAX_NEW_TOKENS, MAX_NEW_WORDS, MAX_WORDS, TAU, WEIGHT,
                      setting)
from .views import EVAL_SUMMARY_COLUMNS, EXAMPLE_COLUMNS, NORMALIZE, THINKING, _example_note, gate_choices


def settings_controls(ui: SimpleNamespace) -> None:
    """The decode settings, made first (the examples fill some of them) and placed in the settings column later."""
    ui.models = gr.Dropdown(choices=list(BUNDLED) + list(PAPER_MODELS), value=list(DEFAULT_PAIR),
                            multiselect=True, allow_custom_value=True, render=False,
                            label="Base models (2–4; type any HF id or local path)", elem_id="af-models",
                            info="Place a model by typing `MODEL@cuda:1`, `MODEL@cpu` or `MODEL@auto,bfloat16` "
                                 "(auto: spread over every GPU; dtype float32, bfloat16 or float16); a model on a "
                                 "vLLM server: `vllm:http://HOST:PORT/v1#SERVED-NAME`.")
    ui.tau = setting(TAU, value=DecodeConfig.tau, label="τΔ: commit when Δ ≥ τΔ", render=False,
                     elem_id="af-tau", info=teach.TAU_INFO)
    ui.max_words = setting(MAX_WORDS, value=DecodeConfig.max_words, label="M: most words per confident round",
                           render=False, elem_id="af-m", info=teach.M_INFO)
    ui.branches = setting(BRANCHES, value=DecodeConfig.branches, label="B: candidates when unsure",
                          render=False, elem_id="af-b", info=teach.B_INFO)
    ui.diversity = gr.Checkbox(DecodeConfig.diversity, label="Diverse exploration (off = beam search)", render=False,
                               elem_id="af-diversity")
    ui.exploration = gr.Radio(["surface", "embedding"], value=DecodeConfig.exploration, render=False,
                              elem_id="af-exploration",
                              label="Diverse in spelling (surface) or in meaning (embedding)",
                              info="embedding: each next first token maximizes log p − λ·(similarity of its input "
                                   "embedding to the tokens already picked)")
    ui.lam = setting(LAMBDA, value=1.0, label="λ: redundancy penalty (embedding; 0 = surface)",
                     render=False, elem_id="af-lambda", info=teach.LAMBDA_INFO)
    ui.max_new_words = setting(MAX_NEW_WORDS, value=40, label="Max new words", render=False,
                               elem_id="af-max-words")
    ui.max_new_tokens = setting(MAX_NEW_TOKENS, value=1024, elem_id="af-max-tokens", render=False,
                                label="Max new tokens (each model's tokenizer; the larger count binds)")
    ui.mode = gr.Radio(["raw", "chat"], value="raw", label="Prompt mode", render=False)
    ui.stop = gr.Textbox(value="", lines=2, label="Stop strings (one per line, \\n for newline)", render=False,
                         elem_id="af-stop", info="Raw mode: proposed from the prompt as you type or paste it (\\n after "
                         "\"Answer:\", the next example's label such as \\nQuestion: when answers span lines) — "
                         "edit or clear them. Escapes: \\n \\t \\r \\\\.")
    ui.system = gr.Textbox(value="", lines=2, label="System prompt (chat mode)", render=False, elem_id="af-system",
                           info="Put first as a system message where the chat template has that role, else at the "
                                "start of the user message; raw mode ignores it (the trace says so).")
    ui.thinking = gr.Radio(list(THINKING), value="template default", render=False, elem_id="af-thinking",
                           label="Thinking (chat templates with a switch, e.g. Qwen3)",
                           info="Models whose template has no switch ignore it; the trace notes which.")


def main_column(ui: SimpleNamespace, examples: list[dict]) -> None:
    """The prompt, the buttons, the status line, the examples and the fused answer; then the views."""
    ui.prompt = gr.Textbox(lines=5, label="Prompt", elem_id="af-prompt",
                           placeholder="Type a prompt or pick an example below. Small models answer "
                                       "better after one worked example: \"Question: What is the capital "
                                       "of Italy?\nAnswer: Rome\n\nQuestion: Who wrote Hamlet?\nAnswer:\"")
    teach.bare_question_hint(ui)
    with gr.Row():
        ui.run_btn = gr.Button("▶ Run", variant="primary", elem_id="af-run")
        ui.step_btn = gr.Button("Step ›", elem_id="af-step")
        ui.cancel_btn = gr.Button("■ Cancel", variant="stop", elem_id="af-cancel", interactive=False)
        ui.reset_btn = gr.Button("↺ Reset", elem_id="af-reset")
    ui.status = gr.Markdown("", elem_id="af-status")
    ui.example_view = gr.HTML("", elem_id="af-example")  # an opened evaluation example: all about it
    gr.Examples(examples=[[e["prompt"], e["mode"], e["stop"], e["max_words"]] for e in examples],
                inputs=[ui.prompt, ui.mode, ui.stop, ui.max_new_words], outputs=[ui.status], fn=_example_note,
                run_on_click=True, cache_examples=False, api_visibility="private",
                example_labels=[e["label"] for e in examples], label="Examples")
    ui.choice = gr.Dropdown(choices=[], label="Step mode: candidate to commit next (default: the winner)",
                            interactive=False, elem_id="af-choice")
    ui.fused = gr.HTML(plots.fused_html(None), elem_id="af-fused")
    view_tabs(ui)


def view_tabs(ui: SimpleNamespace) -> None:
    """The views of one decode, a tab each: fused vs alone, margins, pool, tree, tokens, words per round, cost."""
    with gr.Tabs(elem_id="af-views") as ui.view_tabs:
        with gr.Tab("Fused vs alone", id="compare"):
            ui.compare_view = gr.HTML(plots.compare_html(None, None), elem_id="af-compare")
        with gr.Tab("Margins", id="margins"):
            ui.margins_plot = gr.Plot(plots.margins_figure(None), elem_id="af-margins")
        with gr.Tab("Pool", id="pool"):
            ui.round_sel = gr.Slider(0, 1, value=0, step=1, label="Round", interactive=False,
                                     elem_id="af-round")
            ui.pool_plot = gr.Plot(plots.pool_figure(None), elem_id="af-pool")
            ui.picks_df = gr.Dataframe(plots.selection_frame(None, -1), wrap=True, elem_id="af-picks",
                                       label="First tokens the unsure models looked at: picked or skipped, "
                                             "and why")
        with gr.Tab("Tree", id="tree"):
            gr.Markdown("Every round's pool; the chosen path is marked ✓. **Click a candidate that was "
                        "not chosen** (or enter its round and number below) to branch a new decode from "
                        "there: both answers then stand side by side under *Fused vs alone*.")
            ui.tree_view = gr.HTML(tree_html(None), elem_id="af-tree")
            with gr.Row():
                ui.branch_round = gr.Number(label="Branch from round", precision=0, minimum=0,
                                            elem_id="af-branch-round")
                ui.branch_cand = gr.Number(label="with candidate", precision=0, minimum=0,
                                           elem_id="af-branch-cand")
                ui.branch_btn = gr.Button("Branch here", elem_id="af-branch")
        with gr.Tab("Tokens", id="tokens"):
            gr.Markdown("How each model tokenizes a candidate in context, each token's log-prob, the "
                        "token that straddles the word boundary, and the top tokens at the word start "
                        "with the margin Δ (needs the trace's models; they load if needed).")
            with gr.Row():
                ui.tok_round = gr.Number(label="Round", precision=0, minimum=0, elem_id="af-tok-round")
                ui.tok_cand = gr.Number(label="Candidate", precision=0, minimum=0, value=0,
                                        elem_id="af-tok-cand")
                ui.tok_btn = gr.Button("Show tokens", elem_id="af-tok-show")
            ui.tok_view = gr.HTML("", elem_id="af-tokens")
        with gr.Tab("Words/round", id="wpr"):
            ui.wpr_plot = gr.Plot(plots.words_per_round_figure(None), elem_id="af-wpr")
        with gr.Tab("Rounds & cost", id="rounds"):
            ui.rounds_df = gr.Dataframe(plots.rounds_frame(None), label="Rounds", elem_id="af-rounds",
                                        wrap=True)
            ui.cost_plot = gr.Plot(plots.cost_figure(None), elem_id="af-cost")
            ui.cost_df = gr.Dataframe(plots.cost_frame(None), label="Forward passes, tokens fed, seconds",
                                  elem_id="af-cost-table")


def settings_column(ui: SimpleNamespace) -> None:
    """Models, device and every setting of the decode; the loaded models."""
    ui.models.render()
    ui.device = gr.Dropdown(device_choices(), value="default", label="Device for all models",
                            info="Added to each model without its own @DEVICE; default: CUDA when "
                                 "present, else CPU.", elem_id="af-device")
    ui.load_btn = gr.Button("Load models", size="sm")
    ui.load_status = gr.Markdown("Bundled pair preselected; models load on first use.",
                                 elem_id="af-load-status")
    ui.trust = gr.Checkbox(False, label="Trust remote code (runs the Python a model's repository ships: "
                                        "only for repositories you trust)", elem_id="af-trust",
                           interactive=remote_code_allowed(),
                           info=None if remote_code_allowed() else "off on this server "
                                "(ADAFUSE_ALLOW_REMOTE_CODE)")
    teach.how_it_works(ui)
    for c in (ui.tau, ui.max_words, ui.branches, ui.diversity, ui.exploration, ui.lam, ui.max_new_words,
              ui.max_new_tokens, ui.mode, ui.stop):
        c.render()
    weights_panel(ui)
    with gr.Accordion("Chat mode: system prompt and thinking", open=False):
        ui.system.render()
        ui.thinking.render()
    ui.speculate = gr.Checkbox(DecodeConfig.speculate, elem_id="af-speculate",
                               label="Speculative proposals (same decode, fewer forward passes)",
                               info="A confident model first checks the spans proposed before it this "
                                    "round in one forward and takes their tokens where it would have "
                                    "written them; the cost view counts drafts, accepted tokens, "
                                    "forwards saved.")
    ui.compare = gr.Checkbox(True, label="Also run each model alone (greedy)")
    ui.others = gr.CheckboxGroup(list(COMPARE_METHODS), value=[], label="Also decode with (side by side)")
    with gr.Accordion("Loaded models", open=True):
        # wrapped, in widths that leave every column in view in the narrow settings column (1280 px)
        ui.loaded_df = gr.Dataframe(loaded_frame([]), label="Loaded models", interactive=False,
                                    elem_id="af-loaded", wrap=True,
                                    column_widths=["36%", "14%", "20%", "15%", "15%"])
        with gr.Row():
            ui.unload_pick = gr.Dropdown([], label="Loaded model", scale=2, elem_id="af-unload-pick")
            ui.unload_btn = gr.Button("Unload", size="sm", scale=1, elem_id="af-unload")


def weights_panel(ui: SimpleNamespace) -> None:
    """Each model's weight, the NLL averaging and the learned gates."""
    with gr.Accordion("Model weights in the fused score", open=False):
        gr.Markdown("Fused score = Σ w·NLL / Σ w: a stronger model can count more (0: shown, not "
                    "counted). Equal weights are the paper's mean.")
        ui.weights = [setting(WEIGHT, value=1, label=f"Weight of {n}" if i < len(DEFAULT_PAIR)
                              else "Weight", visible=i < len(DEFAULT_PAIR), elem_id=f"af-weight-{i}")
                      for i, n in enumerate(list(DEFAULT_PAIR) + [""] * (MAX_MODELS - len(DEFAULT_PAIR)))]
        ui.normalize = gr.Radio(list(NORMALIZE), elem_id="af-normalize",
                                value=next(k for k, v in NORMALIZE.items() if v == DecodeConfig.normalize),
                                label="Each model's NLL of a candidate, averaged",
                                info="Per word by default, as everywhere (measured the better default: "
                                     "docs/defaults.md; per token is the paper's rule). Per token a word with a "
                                     "near-certain tail (\" 1.\": an unsure \" 1\", a sure \".\") can beat a "
                                     "likelier word; per word counts a word's whole NLL, the end of the answer "
                                     "one word; per byte divides the whole NLL by the text's UTF-8 bytes, the "
                                     "same count for every tokenizer.")
        ui.allow_empty = gr.Checkbox(value=DecodeConfig.allow_empty, elem_id="af-allow-empty",
                                     label="Let the answer end before its first word (the paper's pool)",
                                     info="Off by default: while the answer is empty, a model's proposal to end it "
                                          "is left out when another candidate is in the round (a question's line "
                                          "end can be likelier than its answer's first word).")
        ui.gate = gr.Dropdown(gate_choices(), value="", label="Learned gate (per-round weights)",
                              info="Weights each round from what the models show (margin, entropy, "
                                   "confidence, own NLL, position); replaces the sliders. Trained for "
                                   "the models it names and sets the NLL averaging it learned with.",
                              elem_id="af-gate")


def answers_tab(ui: SimpleNamespace) -> None:
    """Answers: which of a few candidate answers each model prefers after a question, and the fused pair."""
    with gr.Tab("Answers", id="answers"):
        gr.Markdown("Which of these answers do the models prefer? Each model scores every answer after the question "
                    "in its own tokens (its log-likelihood, the sum over the answer's tokens); the fused score is "
                    "their weighted mean, with the models, weights or gate set above — what lm-eval's "
                    "multiple-choice tasks read. Nothing is generated.")
        with gr.Row():
            ui.ans_question = gr.Textbox(QUESTION, label="Question (the text each answer continues)", lines=3,
                                         elem_id="af-ans-question")
            ui.ans_choices = gr.Textbox(ANSWERS, lines=5, label="Candidate answers, one per line (2 to 5, up to "
                                                                f"{MAX_ANSWER_CHARS} characters each)",
                                        elem_id="af-ans-choices")
        ui.ans_btn = gr.Button("Score the answers", elem_id="af-ans-score")
        ui.ans_status = gr.Markdown("", elem_id="af-ans-status")
        ui.ans_plot = gr.Plot(no_figure(), elem_id="af-ans-plot")
        ui.ans_table = gr.Dataframe(no_frame(), label="Log-likelihoods", elem_id="af-ans-table", interactive=False,
                                    wrap=True)


def evaluate_tab(ui: SimpleNamespace) -> None:
    """Evaluate: a small batch of a task with several methods, its examples, and where the ensemble left a member."""
    with gr.Tab("Evaluate", id="eval"):
        gr.Markdown("Run a small batch of a benchmark task with several methods, then open any "
                    f"example's trace in the views above. Data: {data_source()}.")
        with gr.Row():
            ui.eval_task = gr.Dropdown(list(TASKS), value="triviaqa", label="Task", elem_id="af-eval-task")
            ui.eval_n = setting(EXAMPLES, value=3, label="Examples")
            ui.eval_methods = gr.CheckboxGroup(list(EVAL_METHODS), value=list(BASELINE),
                                               label="Methods")
        ui.eval_btn = gr.Button("Run evaluation", elem_id="af-eval-run")
        ui.eval_status = gr.Markdown("", elem_id="af-eval-status")
        ui.eval_summary = gr.Dataframe(pd.DataFrame(columns=EVAL_SUMMARY_COLUMNS), label="Summary",
                                       elem_id="af-eval-summary", wrap=True)
        gr.Markdown("**Examples** — one row per example: every method's answer, its score under the "
                    "task's metric, ✓/✗ (right: exact match for QA, the final number for GSM8K, chrF ≥ 50 "
                    "for translation) and labels computed from those. Click a column header to sort, a row "
                    "to pick it, then open it in the views above; the CSV has every field in full.")
        with gr.Row():
            ui.eval_filter = gr.Dropdown([analysis.ALL, *analysis.LABELS], value=analysis.ALL,
                                         label="Show", elem_id="af-eval-filter", scale=2)
            ui.eval_csv = gr.DownloadButton("⬇ Examples as CSV", value=None, interactive=False,
                                            elem_id="af-eval-csv", scale=1)
        ui.eval_table = gr.Dataframe(pd.DataFrame(columns=EXAMPLE_COLUMNS), wrap=True, elem_id="af-eval-table",
                                     label="Examples", interactive=False, max_height=420)
        with gr.Row():
            ui.open_line = gr.Number(label="Example (line)", precision=0, elem_id="af-open-line")
            ui.open_method = gr.Dropdown([], label="Method", allow_custom_value=True, elem_id="af-open-method")
            ui.open_btn = gr.Button("Open in the explorer views", elem_id="af-open")
        with gr.Accordion("Where and why the ensemble leaves each member (this run)", open=False):
            ui.div_member = gr.Dropdown([], label="Member", elem_id="af-div-member")
            ui.div_plot = gr.Plot(plots.empty_figure("Where the ensemble leaves a member"),
                                  elem_id="af-div-plot")


def io_tab(ui: SimpleNamespace) -> None:
    """Export / load trace."""
    with gr.Tab("Export / load trace", id="io"):
        ui.download = gr.DownloadButton("⬇ Download trace (JSON)", value=None, interactive=False,
                                        elem_id="af-download")
        ui.upload = gr.UploadButton("📂 Load a saved trace (.json; browse it without any model)",
                                    file_types=[".json"], elem_id="af-upload")
