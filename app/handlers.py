"""The page's event handlers: each takes the session (`Explorer`) and the page's values and returns (or yields, while
it works) the session and what every view shows (`views.render`). The layout and the wiring are in ui.py."""
from __future__ import annotations

import html
import time
from dataclasses import replace

import gradio as gr
import pandas as pd

from adafuse.gate import load_gate
from adafuse.stops import format_stops, propose_stops

from . import analysis, leases, plots, public
from .answers import (answers_figure, answers_frame, answers_summary, blank_note, check_answers, no_figure,
                      no_frame)
from .controller import Explorer, friendly, model_specs, unload
from .divergence_view import divergence_figure, divergence_html
from .explain_html import token_view_html
from .gpu import gpu
from .plots import count
from .sliders import BRANCHES, EXAMPLES, MAX_WORDS, TAU
from .views import (EXAMPLE_COLUMNS, NORMALIZE, USER, _confirm, _error, _settings, done_with, in_line, loaded_views,
                    only_status, pool_view, render, restored, take_slot)


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


def shown(ex, status: str, **kw):
    """The outputs for session `ex`, or for the fresh one a Reset made while this handler was still working
    (its last outputs must not bring the old session back)."""
    if ex.replaced_by is not None:
        return (ex.replaced_by, *render(ex.replaced_by, "↺ reset"))
    return (ex, *render(ex, status, **kw))


LIVE_REDRAW_S = 1.0  # while rounds stream in, the charts and tables are drawn again at most this often


def streamed(rows):
    """The outputs for each (session, status, render options) a lease yields: a round that streams in within
    LIVE_REDRAW_S of the last full drawing updates the answer and the status only (`render(live=True)`). Drawing four
    Plotly charts costs the server ~0.1 s a round and the visitor's browser more: rounds that come faster (small
    models, a GPU) would wait on the page. Every other line (loading, comparisons, the end) is drawn in full."""
    drawn = float("-inf")
    for ex, status, kw in rows:
        live = kw.pop("live", False) and time.monotonic() - drawn < LIVE_REDRAW_S
        if not live:
            drawn = time.monotonic()
        yield shown(ex, status, live=live, **kw)


def failed(ex, exc):
    """A handler's error, unless a Reset replaced the session meanwhile (then the fresh one is shown)."""
    return shown(ex, "") if ex.replaced_by is not None else (ex, *_error(ex, exc))


def session(ex: Explorer | None, allow) -> Explorer:
    """The page's session (a new one on a fresh page) with the page's remote-code setting: how every decoding press
    begins."""
    ex = ex or Explorer()
    ex.trust_remote_code = bool(allow)
    return ex


def planned(ex: Explorer, names, s, prompt_text: str, dev, button: str, step: bool = False):
    """What Run and Step do before decoding, once the press has taken the session (`Explorer.claim`): the settings
    read from the page, what the press would do to the decode on view (`Explorer.plan`) and the visitor admitted to
    it (`public.admit`: on a public server the prompt and word cap within the limits; a press that starts a decode
    counts against the visitor's decodes a minute). Returns (settings, what changed, outputs asking to press again
    or None): a press that would drop unfinished rounds, replace an opened trace or start a finished decode over asks
    first, and leaves the session free."""
    cfg = _settings(*s)
    kind, what = ex.plan(names, cfg, prompt_text, dev, step=step)
    if kind in ("confirm", "replace", "finished"):
        ex.running = False
        return cfg, what, (ex, *render(ex, _confirm(ex, kind, what, button)))
    public.admit(prompt_text, cfg.max_new_words, decodes=0 if step and kind == "continue" else 1)
    return cfg, what, None


def on_run(ex, names, dev, allow, prompt_text, want_singles, other_methods, picked, *s):
    ex = session(ex, allow)
    if not ex.claim():
        yield (ex, *only_status("A decode is already running in this session: wait, or press ■ Cancel."))
        return
    ticket, pressed = None, time.monotonic()  # the status's clock: what the visitor waited, each part named
    try:
        cfg, what, asked = planned(ex, names, s, prompt_text, dev, "▶ Run")
        if asked:
            yield asked
            return
        ex.live_config = None
        ticket = yield from in_line(ex, "run")
        parts = {"waiting for a slot": time.monotonic() - pressed}
        if ticket is None:
            ex.running = False
            yield shown(ex, "■ left the line: nothing was decoded")
            return
        yield from streamed(leases.run(ex, names, dev, cfg, prompt_text, picked, what, other_methods, want_singles,
                                       pressed, parts))  # the page is drawn outside the lease
    except Exception as exc:  # noqa: BLE001
        ex.running = False
        yield failed(ex, exc)
    finally:  # also when the page goes away mid-run (Gradio closes the handler)
        ex.running = False
        done_with(ticket)


def on_step(ex, names, dev, allow, prompt_text, picked, *s):
    ex = session(ex, allow)
    if not ex.claim():  # a toast: the running decode keeps writing the status line
        msg = "Step is not available while ▶ Run is decoding: wait for it to end, or press ■ Cancel first."
        gr.Warning(msg)
        return (ex, *only_status(msg))
    ticket = None  # Run, Branch, loading wait; Cancel waits for the phase
    try:
        cfg, what, asked = planned(ex, names, s, prompt_text, dev, "Step ›", step=True)
        if asked:
            return asked
        ticket = take_slot(ex, "step")
        if ticket is None:
            ex.running = False
            return shown(ex, "■ left the line: nothing was stepped")
        ex, note = leases.step(ex, names, dev, cfg, prompt_text, picked, what)
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


def on_branch(ex, r_idx, c_idx):
    ex = ex or Explorer()
    if not ex.claim():
        yield (ex, *only_status("Wait for the Run to end (or ■ Cancel it) before branching."))
        return
    ticket = None
    try:
        if ex.trace is not None:  # a branch decodes on with the trace's own prompt and settings (and an opened
            for name in ex.trace.models if ex.opened else ():  # trace's own models, checked before it counts)
                public.policy().check_model(name)
            public.admit(ex.trace.prompt, ex.trace.settings.get("max_new_words"))
        ticket = yield from in_line(ex, "branch")
        if ticket is None:
            ex.running = False
            yield shown(ex, "■ left the line: nothing was branched")
            return
        yield shown(ex, f"… branching from round {r_idx}: deciding the rounds before it again", export=False)
        yield from streamed(leases.branch(ex, r_idx, c_idx))  # the page is drawn outside the lease
    except Exception as exc:  # noqa: BLE001
        ex.running = False
        yield failed(ex, exc)
    finally:
        ex.running = False
        done_with(ticket)


def on_tokens(ex, r_idx, c_idx):
    ex = ex or Explorer()
    try:
        return token_view_html(leases.tokens(ex, r_idx, c_idx))
    except Exception as exc:  # noqa: BLE001
        return f'<div class="af-empty">⚠️ {html.escape(friendly(exc))}</div>'


def on_reset(ex):
    fresh = Explorer()
    if ex is not None:
        ex.cancel_requested = True  # a run still under way stops at its next round
        ex.replaced_by = fresh      # and whatever it shows last is this fresh session
    return (fresh, *render(fresh, "↺ reset"))


def on_round(ex, idx):
    return pool_view(ex or Explorer(), int(idx))


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


def on_eval(ex, task_name, n, methods, names, dev, allow, tau_v, m_v, b_v, norm, empty,
            progress=gr.Progress(track_tqdm=True)):
    from adafuse.harness.evaluate import summarize
    ex = session(ex, allow)
    try:
        model_specs(names, dev)  # the models allowed here, before the examples are counted
        public.admit(decodes=EXAMPLES.snap(n))  # each example counts against the visitor's decodes a minute
        ex = leases.evaluate(ex, task_name, EXAMPLES.snap(n), methods, names,
                             {"tau": TAU.snap(tau_v), "max_words": MAX_WORDS.snap(m_v), "branches": BRANCHES.snap(b_v),
                              "normalize": NORMALIZE.get(norm, norm), "allow_empty": bool(empty)}, dev)
        rows = ex.eval_rows
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


def on_answers(ex, question, text, dev, allow, *s):
    """Answers: every candidate answer scored after the question by each model and the fused pair."""
    ex = session(ex, allow)
    try:
        check_answers(question, text)  # input that is no choice is said before any model loads or a GPU is leased
        model_specs(s[0], dev)  # the models allowed here, before the press is counted
        public.admit(question, what="the question")
        answers, scored = leases.answers(ex, s[0], dev, _settings(*s), question, text)
        said = " ".join(x for x in (answers_summary(answers, scored), blank_note(text)) if x)
        return ex, said, answers_figure(answers, scored), answers_frame(answers, scored)
    except Exception as exc:  # noqa: BLE001 - the earlier answers' chart and table go: they are not these answers'
        return (ex, f"⚠️ **Error:** {html.escape(friendly(exc))}", no_figure("Nothing scored: see the error above"),
                no_frame())


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
    keep = [gr.update()] * (5 + len(restored({}, 0)))
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
                gr.update(selected="pool" if focus else "compare"), USER)  # its stop strings: kept as the user's
    except Exception as exc:  # noqa: BLE001
        return (ex, *_error(ex, exc), *keep)


def stops_for(text, mode_v, stop_v, offered, edited: bool = False) -> tuple[str, tuple[str, ...] | str]:
    """The stop box's value for the prompt `text`, and the proposals this page has made (`offered`). Raw mode proposes
    stop strings from the prompt; chat mode none (a chat answer spans lines). The box keeps the user's own (`offered`
    is `USER`: `edited`, the page saw the user edit the box, even to empty; or an opened trace's) and a value the page
    never proposed (an example's). Any value the page did propose gives way, however old: a proposal read from an
    earlier text can land after a later one (a paste, then Run at once), and it is not the user's."""
    stop_v = stop_v or ""
    if edited:
        offered = USER
    if offered == USER or stop_v not in offered:
        return stop_v, offered
    new = format_stops(propose_stops(text or "")) if mode_v == "raw" else ""
    return new, offered if new in offered else (*offered, new)


def on_prompt(text, mode_v, stop_v, offered, edited=False):
    """The prompt or the mode changed: the stop box shows the proposal for it (`stops_for`)."""
    new, offered = stops_for(text, mode_v, stop_v, offered, edited)
    return (gr.update() if new == (stop_v or "") else new), offered


def on_press(text, mode_v, stop_v, offered, edited=False):
    """Run or Step pressed: the stop strings for the prompt as it is now, shown in the box and held for the decode
    (a late proposal may still rewrite the box before the decode reads it: the decode reads what this decided)."""
    new, offered = stops_for(text, mode_v, stop_v, offered, edited)
    return new, offered, new


def on_live(ex, *s):
    """A setting moved while a Run decodes: live ones apply from the next round (the run marks it), the
    others wait for the next decode (said at once)."""
    if ex is None or not ex.running or ex.decoding is None or ex.key is None:
        return
    try:
        cfg = _settings(*s)
        public.policy().check_words(cfg.max_new_words)  # a cap raised mid-Run is held to the limit too
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
