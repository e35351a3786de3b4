"""The model work of the page's handlers and the scripting API, each piece one GPU lease (`gpu`: `spaces.GPU` on a
ZeroGPU Space, nothing anywhere else): loading the models, reading the prompt, every round, the comparisons, branches,
token views, scores and evaluations run here. The handlers (handlers.py) wait for a decoding slot before a lease and
draw the page outside one.

Each function takes the session and hands it back with what it did (as a Run's updates, or returned): on ZeroGPU a
lease runs in a worker process, where the session it changes is a copy."""
from __future__ import annotations

import html
import time

from adafuse.models import free_unused_memory

from .answers import score_answers
from .controller import stop_note
from .gpu import gpu
from .plots import count, progress


@gpu
def run(ex, names, dev, cfg, prompt_text: str, picked, what: str, other_methods, want_singles, pressed: float,
        parts: dict):
    """▶ Run's lease, from loading the models to the last comparison: yields (session, status, render options) as
    each model loads and each round is decided, the last one the status that says how the run ended. `parts`: the
    named waits so far ("waiting for a slot"), `pressed`: time.monotonic() of the press."""
    t = time.monotonic()
    for i, n, spec, lm, secs in ex.load_each(names, dev):  # a cold start says which model it is on
        if lm is None:
            yield ex, f"… loading model {i} of {n}: {html.escape(spec)}", dict(export=False)
        elif secs > 1:
            yield ex, f"… {html.escape(lm.name)} ready ({secs:.1f}s)", dict(export=False, loaded=True)
    parts["loading models"], t = time.monotonic() - t, time.monotonic()
    yield ex, "… reading the prompt", dict(export=False)
    before = ex.decoding
    d = ex.begin(names, cfg, prompt_text, resume=True, device=dev)
    changed = f" ({what} from round {d.trace.changes[-1]['from_round']})" if what else ""
    if d is before and d.pending is not None and picked is not None:  # the step mode's pick goes first
        r = d.commit(int(picked))
        changed += f" (round {r.index}: " + ("your pick" if r.overridden else "the winner") + ")"
    yield ex, f"… decoding{changed}", dict(export=False, loaded=True)
    moved = ""  # the last settings moved during the Run, said on every round's line after it
    while not d.done and not ex.cancel_requested and not ex.past_deadline(d):
        d.step()
        now = ex.apply_live(d)  # settings moved during the Run: from the next round on, marked
        moved = f" · {now} from round {d.trace.changes[-1]['from_round']}" if now else moved
        # from the trace the answer is drawn from, in its legend's words: the status never counts other rounds
        yield ex, f"… {progress(ex.trace)}{html.escape(moved)}", dict(export=False, live=True)
    t = time.monotonic()
    if not ex.cancel_requested:
        for label in ex.run_others(names, cfg, prompt_text, other_methods, dev):
            yield ex, f"… {label} done", dict(export=False)
    if want_singles and not ex.cancel_requested:
        for name in ex.run_singles(names, cfg, prompt_text, dev):
            yield ex, f"… {name} alone done", dict(export=False)
    parts["the comparisons"] = time.monotonic() - t
    ex.running = False
    yield ex, ran(d, ex.cancel_requested, parts, time.monotonic() - pressed), dict(loaded=True)


def ran(d, cancelled: bool, parts: dict, waited: float) -> str:
    """The status a Run ends with: cancelled (and what is kept), or done with its durations and why it stopped."""
    if cancelled and not d.done:  # kept unfinished: Step or Run goes on from these words
        kept = count(d.trace.words, "word")
        return (f"■ cancelled after round {len(d.trace.rounds)}: the {kept} so far "
                f"{'is' if d.trace.words == 1 else 'are'} kept — Step › or ▶ Run continues from there, ↺ Reset "
                "starts over")
    if cancelled:  # the fused decode had finished: only the comparisons were stopped
        return (f"■ cancelled the comparisons; the fused decode had finished: {count(d.trace.words, 'word')}, "
                f"{stop_note(d.trace)}")
    named = ", ".join(f"{k} {v:.1f}s" for k, v in parts.items() if v >= 0.1)
    return (f"✓ done: {count(d.trace.words, 'word')} in {count(len(d.trace.rounds), 'round')} "
            f"({d.trace.seconds:.1f}s wall clock of the fused decode; {waited:.1f}s in all"
            f"{': ' + named if named else ''}), {stop_note(d.trace)}")


@gpu
def step(ex, names, dev, cfg, prompt_text: str, picked, what: str):
    """Step ›'s lease: commit the round on view (the visitor's pick, or its winner) and decide the next one, or
    start the decode. Returns (session, what it did); the visitor reads the pool with no GPU held."""
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
    return ex, note


@gpu
def branch(ex, r_idx, c_idx):
    """A branch's lease: the rounds before it decided again, then on to the end; yields (session, status, render
    options) after each round, the last one the status it ends with."""
    label = d = None
    for label, d in ex.branch(r_idx, c_idx):
        yield ex, f"… {html.escape(label)}: round {len(d.trace.rounds)} · {count(d.trace.words, 'word')}", \
            dict(export=False, live=True)
    ex.running = False
    yield ex, (f"✓ {html.escape(label)}: {count(d.trace.words, 'word')} ({stop_note(d.trace)}); see it beside the "
               "original under *Fused vs alone*"), dict(loaded=True)


@gpu
def tokens(ex, r_idx, c_idx) -> list[dict]:
    """How each model tokenized and scored a candidate of the trace on view (each model reads it again)."""
    return ex.tokens(r_idx, c_idx)


@gpu(duration=600)
def evaluate(ex, task_name: str, n, methods, names, base: dict, dev):
    """The Evaluate tab's batch; returns the session holding its rows (`eval_rows`)."""
    try:
        ex.evaluate(task_name, n, methods, names, base, dev)
        return ex
    finally:
        free_unused_memory()


@gpu
def answers(ex, names, dev, cfg, question: str, text: str):
    """The Answers tab: every candidate answer scored after the question by each model; (answers, their scores)."""
    try:
        return score_answers(ex.models(names, dev), cfg, question, text)
    finally:
        free_unused_memory()
