"""AdaFuse Explorer: the page (app/layout.py), its handlers (app/handlers.py) and the wiring between them here."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from . import api, layout, public, teach
from .controller import DECODE_QUEUE, Explorer, load_examples, slots
from .handlers import (on_answers, on_branch, on_cancel, on_eval, on_filter, on_live, on_load, on_member, on_open,
                       on_pick_row, on_press, on_prompt, on_reset, on_round, on_run, on_step, on_tokens, on_unload,
                       on_upload)
from .sliders import snap_typed
from .style import CSS, INTRO, SHORTCUTS, STOP_EDITED, TO_ANSWER, TO_VIEWS
from .views import CANCEL_AT, N_OUTPUTS, STATUS_AT, gate_normalize, loaded_views, weight_sliders

__all__ = ["CSS", "build_demo"]

# only /decode and /models are the app's API (app/api.py)
HIDDEN = dict(api_visibility="private")


QUEUE_POLL_S = 0.02  # how often Gradio's queue looks for an event to start while it has none (its own: every 1 ms)


def queued(demo: gr.Blocks, **kw) -> gr.Blocks:
    """`demo.queue(**kw)`, its queue looking for work every QUEUE_POLL_S rather than Gradio 6's every millisecond
    (and its progress loop every 10 ms): an idle toy app spent 1.10 CPU-seconds in 15 idle seconds on those loops, 0.19
    with these (a Space waits for visitors all day). A press starts at most QUEUE_POLL_S later.
    Attributes of Gradio's own `Queue`, set where they exist: a Gradio without them polls as it does."""
    demo.queue(**kw)
    q = getattr(demo, "_queue", None)
    for attr in ("sleep_when_free", "progress_update_sleep_when_free"):
        if isinstance(getattr(q, attr, None), float):
            setattr(q, attr, max(getattr(q, attr), QUEUE_POLL_S))
    return demo


def build_demo(rules: public.Policy | None = None) -> gr.Blocks:
    """The page; `rules`: what its visitors may do (default: the app's policy, `public.policy()`)."""
    slots()  # the decoding slots from the environment, now: a bad ADAFUSE_DECODE_SLOTS stops the launch, not a Run
    rules = rules or public.policy()  # likewise a bad ADAFUSE_SERVERS or limit
    examples = load_examples()
    ui = SimpleNamespace()
    with gr.Blocks(title="AdaFuse Explorer") as ui.demo:
        ui.state = gr.State(Explorer())  # each visitor's own copy from the first press: two quick presses share it
        ui.offered = gr.State(("",))  # the stop strings the page proposed so far (USER: the box is the user's own)
        ui.stop_edited = gr.Checkbox(False, visible=False)  # its value comes from the page (`STOP_EDITED`)
        gr.Markdown(INTRO)
        layout.settings_controls(ui)
        with gr.Row():
            with gr.Column(scale=2, min_width=320, elem_id="af-main"):  # first: on a phone the prompt comes first
                layout.main_column(ui, examples)
            with gr.Column(scale=1, min_width=300, elem_id="af-settings"):
                layout.settings_column(ui)
        with gr.Tabs():  # work on many prompts, and traces kept as files: full width below
            layout.answers_tab(ui)
            layout.evaluate_tab(ui)
            layout.io_tab(ui)
        public.fit_page(ui, rules)
        ui.outputs = [ui.fused, ui.compare_view, ui.margins_plot, ui.pool_plot, ui.wpr_plot, ui.rounds_df, ui.cost_df,
                      ui.cost_plot, ui.round_sel, ui.choice, ui.status, ui.download, ui.loaded_df, ui.unload_pick,
                      ui.cancel_btn, ui.tree_view, ui.picks_df, ui.example_view]
        assert len(ui.outputs) == N_OUTPUTS
        assert ui.outputs[STATUS_AT] is ui.status and ui.outputs[CANCEL_AT] is ui.cancel_btn
        ui.settings = [ui.models, ui.tau, ui.max_words, ui.branches, ui.diversity, ui.exploration, ui.lam,
                       ui.max_new_words, ui.max_new_tokens, ui.mode, ui.stop, ui.system, ui.thinking, ui.speculate,
                       ui.normalize, ui.allow_empty, ui.gate, *ui.weights]
        # what opening an evaluated example sets back to the settings it was decoded with (`views.restored`)
        ui.restorable = [ui.mode, ui.stop, ui.tau, ui.max_words, ui.branches, ui.diversity, ui.exploration, ui.lam,
                         ui.max_new_words, ui.max_new_tokens, ui.speculate, ui.normalize, ui.allow_empty, ui.gate,
                         ui.system, *ui.weights]
        api.register()  # /decode and /models for gradio_client
        wire_page(ui)
        wire_decoding(ui)
    return ui.demo


def wire_page(ui: SimpleNamespace) -> None:
    """The page's loading, the models panel, Evaluate and opening an evaluated example."""
    hidden, refresh = HIDDEN, [ui.loaded_df, ui.unload_pick]
    ui.models.change(weight_sliders, [ui.models], ui.weights, show_progress="hidden", **hidden)
    for c in (ui.tau, ui.max_words, ui.branches, ui.lam, ui.max_new_words, ui.max_new_tokens, *ui.weights, ui.eval_n):
        # a typed value the slider cannot show is set to the nearest one it can when the box loses focus, said
        c.release(snap_typed(c.spec), [c], [c], show_progress="hidden", concurrency_limit=None, **hidden)
    ui.gate.change(gate_normalize, [ui.gate, ui.normalize], ui.normalize, show_progress="hidden", **hidden)
    ui.demo.load(loaded_views, None, refresh, show_progress="hidden", **hidden)
    ui.demo.load(None, None, None, js=SHORTCUTS, **hidden)
    ui.load_btn.click(on_load, [ui.models, ui.device, ui.trust], [ui.load_status], **hidden).then(
        loaded_views, None, refresh, show_progress="hidden", **hidden)
    ui.unload_btn.click(on_unload, [ui.unload_pick], [ui.load_status, *refresh], **hidden)
    ui.eval_btn.click(on_eval, [ui.state, ui.eval_task, ui.eval_n, ui.eval_methods, ui.models, ui.device, ui.trust,
                                ui.tau, ui.max_words, ui.branches, ui.normalize, ui.allow_empty],
                      [ui.state, ui.eval_status, ui.eval_summary, ui.eval_filter, ui.eval_table, ui.eval_csv,
                       ui.open_method, ui.open_line, ui.div_member, ui.div_plot],
                      concurrency_limit=1, concurrency_id="eval", **hidden).then(loaded_views, None, refresh,
                                                                                show_progress="hidden", **hidden)
    ui.ans_btn.click(on_answers, [ui.state, ui.ans_question, ui.ans_choices, ui.device, ui.trust, *ui.settings],
                     [ui.state, ui.ans_status, ui.ans_plot, ui.ans_table], concurrency_limit=DECODE_QUEUE,
                     concurrency_id="decode", **hidden).then(loaded_views, None, refresh, show_progress="hidden",
                                                             **hidden)
    ui.eval_filter.input(on_filter, [ui.state, ui.eval_filter], [ui.eval_table, ui.eval_status], **hidden)
    ui.eval_table.select(on_pick_row, None, [ui.open_line], show_progress="hidden", **hidden)
    ui.div_member.input(on_member, [ui.state, ui.div_member], [ui.div_plot], **hidden)
    ui.open_btn.click(on_open, [ui.state, ui.open_line, ui.open_method],
                      [ui.state, *ui.outputs, ui.prompt, *ui.restorable, ui.tok_round, ui.tok_cand, ui.view_tabs,
                       ui.offered], **hidden).then(None, js=TO_VIEWS, **hidden)


def wire_decoding(ui: SimpleNamespace) -> None:
    """The prompt's stop proposals, settings moved during a Run, and Run, Step, Cancel, Branch, Reset, Tokens."""
    hidden = HIDDEN
    offered = ui.offered
    # the prompt's handlers run one at a time, in the order the page sent them: a proposal read from the
    # text before a click on the frame cannot land after the frame's own
    in_order = dict(HIDDEN, concurrency_id="prompt", concurrency_limit=1)
    # every change of the prompt or the mode (typed, pasted, an example's, the frame's and chat's own, a prompt the
    # browser restored at load) gets its stop proposal, with whether the user edited the stop box (`STOP_EDITED`)
    stops_in = [ui.prompt, ui.mode, ui.stop, offered, ui.stop_edited]
    gr.on([ui.prompt.change, ui.mode.change, ui.demo.load], on_prompt, stops_in, [ui.stop, offered], js=STOP_EDITED,
          show_progress="hidden", trigger_mode="always_last", **in_order)
    # a bare question read raw: the hint under the prompt offers chat mode or the Question/Answer frame in one click.
    # The hint follows every change of the prompt or the mode, the frame's and chat's own included, with one handler
    # (always_last: its last run reads the box as it is then)
    gr.on([ui.prompt.change, ui.mode.change, ui.demo.load], teach.on_bare, [ui.prompt, ui.mode], [ui.bare],
          show_progress="hidden", trigger_mode="always_last", **in_order)
    ui.bare_frame.click(teach.on_frame, [ui.prompt], [ui.prompt, ui.bare], **in_order)
    ui.bare_chat.click(teach.on_chat, None, [ui.mode, ui.bare], **in_order)
    for c in ui.settings[1:]:  # every setting but the models
        c.input(on_live, [ui.state, *ui.settings], None, show_progress="hidden", trigger_mode="always_last",
                concurrency_limit=None, **hidden)
    ui.run_btn.click(None, js=TO_ANSWER, **hidden)
    # Run and Step first take the stop strings proposed from the prompt as it is now, however it got there (typed,
    # pasted, restored by the browser): the decode never starts before the proposal it would have had, and reads it
    # from `run_stops`, not from the box, which a proposal from an earlier text may still rewrite in between (a state
    # is read when its event runs: a second press before the first decode starts decides again, for the same prompt)
    run_stops = gr.State("")
    propose = dict(fn=on_press, inputs=stops_in, outputs=[ui.stop, offered, run_stops], js=STOP_EDITED, queue=False,
                   show_progress="hidden", **hidden)
    settings = [run_stops if c is ui.stop else c for c in ui.settings]
    ui.run_btn.click(**propose).then(
        on_run, [ui.state, ui.models, ui.device, ui.trust, ui.prompt, ui.compare, ui.others, ui.choice, *settings],
        [ui.state, *ui.outputs], show_progress="hidden", concurrency_limit=DECODE_QUEUE, concurrency_id="decode",
        **hidden)
    ui.step_btn.click(**propose).then(
        on_step, [ui.state, ui.models, ui.device, ui.trust, ui.prompt, ui.choice, *settings], [ui.state, *ui.outputs],
        concurrency_limit=DECODE_QUEUE, concurrency_id="decode", **hidden)
    ui.cancel_btn.click(on_cancel, [ui.state], [ui.state, *ui.outputs], **hidden)

    ui.round_sel.input(on_round, [ui.state, ui.round_sel], [ui.pool_plot, ui.picks_df],  # keys move it too
                       show_progress="hidden", **hidden)
    ui.upload.upload(on_upload, [ui.state, ui.upload], [ui.state, *ui.outputs], **hidden)
    ui.branch_btn.click(on_branch, [ui.state, ui.branch_round, ui.branch_cand], [ui.state, *ui.outputs],
                        concurrency_limit=DECODE_QUEUE, concurrency_id="decode", **hidden)
    # Reset does not cancel the running handler through Gradio: an update that handler had already sent could
    # then reach the page after Reset's own and stay there. The handler sees `replaced_by` at its next round and
    # its every later update shows the fresh session, so the last word is always the Reset's
    ui.reset_btn.click(on_reset, [ui.state], [ui.state, *ui.outputs], **hidden)
    ui.tok_btn.click(on_tokens, [ui.state, ui.tok_round, ui.tok_cand], [ui.tok_view], concurrency_limit=DECODE_QUEUE,
                     concurrency_id="decode", **hidden)
