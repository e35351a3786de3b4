"""What the page teaches beside its controls: how a round works (Δ, τΔ, M, B, NLL, the fused score and its unit,
speculative proposals, λ), what each slider's extremes do, and a bare question's two better ways to ask it (chat, or
a Question/Answer frame). Each round's own sentence comes from `adafuse.report.round_sentence`."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from adafuse import DecodeConfig
from adafuse.report import UNIT_WORDS
from adafuse.stops import bare_question, qa_frame

HOW_A_ROUND_WORKS = f"""\
**A round** adds the next word or words to the one answer the models share. Each model looks at where the next word
starts: **Δ** is the probability of its likeliest first token minus the runner-up's.
**Sure** (Δ ≥ **τΔ**): it writes up to **M** words. **Unsure**: it offers **B** different first words, each finished
into a whole word. Every model then scores every candidate: its **NLL** (negative log-likelihood, lower = likelier)
divided by the candidate's length — **{UNIT_WORDS[DecodeConfig.normalize]}** by default (the paper's: per token; set
in the weights panel below), so that short and long candidates compare. The **fused score** is the models' average
NLL; the lowest wins and is appended to the **fused** answer. Before the answer's first word, a proposal to end it is
held back while another candidate is in the round. The Pool tab says each round in words.
**Speculative proposals**: a sure model first checks, in one pass, the spans the others proposed — the same answer,
fewer forward passes. **λ** (embedding exploration) keeps the B first words apart in meaning, not only in spelling."""

# what each slider's extremes do (gr.Slider `info`)
TAU_INFO = ("0: every model is always sure and writes M words a round (fewest rounds); 1: never sure, every round "
            "explores B candidates (slowest, most checked).")
M_INFO = "1: one word per sure round (the others check every word); 5: up to five at once (fewer rounds)."
B_INFO = ("1: an unsure model offers only its likeliest word (no exploration); 8: a wide pool (more to score each "
          "round).")
LAMBDA_INFO = ("0: first words by probability alone (as surface); higher: a first word close in meaning to one "
               "already picked is passed over.")

BARE_HINT = ("**A bare question.** Read as raw text, small base models often go on with more questions or a list. "
             "Ask it as a chat message, or in a Question/Answer frame (its stop ends the answer at the line's end):")


def how_it_works(ui: SimpleNamespace) -> None:
    """The short text beside the settings: what a round, Δ, τΔ, M, B, NLL and the fused score are."""
    with gr.Accordion("How a round works", open=True, elem_id="af-how"):
        gr.Markdown(HOW_A_ROUND_WORKS, elem_id="af-how-text")


def bare_question_hint(ui: SimpleNamespace) -> None:
    """Under the prompt, shown only for a bare question in raw mode: one click to chat mode or to the frame."""
    with gr.Column(visible=False, elem_id="af-bare") as ui.bare:
        gr.Markdown(BARE_HINT)
        with gr.Row():
            ui.bare_chat = gr.Button("Ask as a chat message", size="sm", elem_id="af-bare-chat")
            ui.bare_frame = gr.Button("Question: …\\nAnswer: frame", size="sm", elem_id="af-bare-frame")


def on_bare(text: str, mode: str):
    """The hint's visibility: a bare question read raw."""
    return gr.update(visible=mode == "raw" and bare_question(text))


def on_frame(text: str):
    """The prompt in the Question/Answer frame (the stop proposal follows: ui.py chains it), the hint hidden."""
    return (qa_frame(text) if bare_question(text) else text), gr.update(visible=False)


def on_chat():
    """Chat mode (its stop proposal dropped: ui.py chains it), the hint hidden."""
    return "chat", gr.update(visible=False)
