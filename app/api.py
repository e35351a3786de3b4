"""Named API endpoints for scripts (`gradio_client`): `register()` adds /decode and /models to the app's Blocks."""
import time

import gradio as gr

from adafuse import BUNDLED, DEFAULT_PAIR, PAPER_MODELS, DecodeConfig, Trace
from adafuse.methods import MAX_MODELS
from adafuse.errors import AdafuseError, ConfigError, PromptError
from adafuse.many import DEFAULT_DEADLINE_S
from adafuse.stops import parse_stops

from . import controller, public
from .controller import DECODE_QUEUE, Explorer, model_specs, slots
from .gpu import gpu

# seconds one /decode may run, as the page's decodes and `adafuse serve --timeout`: then it stops before its next
# round, keeping its words (stop reason "deadline")
DEADLINE_S = DEFAULT_DEADLINE_S


def _model_names(models: list[str] | str) -> list[str]:
    """A list of model specs, or one string of them separated by commas."""
    items = models.split(",") if isinstance(models, str) else models
    if not isinstance(items, list) or not all(isinstance(n, str) for n in items):
        raise ConfigError(f"models={models!r} is invalid: give a list of model names or one string of names "
                          f"separated by commas, e.g. {','.join(DEFAULT_PAIR)!r}")
    names = [n.strip() for n in items if n.strip()]
    if not 2 <= len(names) <= MAX_MODELS:
        raise ConfigError(f"{len(names)} model(s) given: an ensemble needs 2 to {MAX_MODELS}, e.g. "
                          f"{','.join(DEFAULT_PAIR)!r}")
    return names


def _stops(stop: list[str] | str) -> tuple[str, ...]:
    """A list of stop strings as they are, or one string of them, one per line, \\n and \\t written as escapes."""
    if isinstance(stop, str):
        return parse_stops(stop)
    if not isinstance(stop, list):
        raise ConfigError(f"stop={stop!r} is invalid: give a list of stop strings or one string, one per line")
    return tuple(stop)


def decode(prompt: str, models: list[str] | str = ",".join(DEFAULT_PAIR), tau: float = 0.7, max_words: int = 3,
           branches: int = 3, max_new_words: int = 40, mode: str = "raw", stop: list[str] | str = "",
           system: str = "", thinking: bool | None = None) -> dict:
    """Decode `prompt` with an ensemble of 2-4 models (names separated by commas). `stop`: one stop string per line,
    \\n written as an escape (or a list). Returns the output, its words and rounds, why it stopped, and the trace.
    On a public server the page's rules hold (`public.Policy`: the operator's models, the visitor's limits)."""
    try:
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptError("the prompt is empty: give the text to continue, e.g. 'Question: ...\\nAnswer:'")
        cfg = DecodeConfig(tau=tau, max_words=max_words, branches=branches, max_new_words=max_new_words, mode=mode,
                           stop=_stops(stop), system=system, thinking=thinking)
        names = model_specs(_model_names(models))  # refused here, before any wait: nothing loads, nothing is reached
        public.admit(prompt, cfg.max_new_words)
        ticket = slots().ticket()  # in line with the page's decodes, holding no GPU while it waits
        try:
            while not slots().try_take(ticket):
                time.sleep(0.5)
            trace = _generate(names, cfg, prompt)
        finally:
            slots().release(ticket)
    except AdafuseError as exc:
        raise _client_error(exc) from exc
    return {"output": trace.output, "words": trace.words, "rounds": len(trace.rounds),
            "stop_reason": trace.stop_reason, "trace": trace.to_dict()}


@gpu
def _generate(names: list[str], cfg: DecodeConfig, prompt: str) -> Trace:
    """/decode's lease (app/gpu.py): the models loaded (or as loaded already), then the whole decode, within the
    server's deadline (`DEADLINE_S`)."""
    try:
        return Explorer().decode(names, cfg, prompt, DEADLINE_S)
    except AdafuseError as exc:  # typed here: ZeroGPU hands other errors back from its worker as a bare class name
        raise _client_error(exc) from exc


def _client_error(exc: AdafuseError) -> gr.Error:
    """A caller's mistake as the client sees it (gradio_client raises AppError with the message); the server log
    stays free of tracebacks for it."""
    return gr.Error(str(exc), title=type(exc).__name__, print_exception=False)


def list_models() -> dict:
    """Model names to try: the bundled pair (offline), the paper's models (Hub ids), the models loaded now, and on a
    public server the ones its operator allows (`allowed`, and `servers` for vllm:URL#NAME; `public` says which)."""
    rules = public.policy()
    out = {"bundled": list(BUNDLED), "default_pair": list(DEFAULT_PAIR), "paper": list(PAPER_MODELS),
           "loaded": [lm.info() for lm in controller.MODELS.loaded()], "public": rules.public}
    return out | ({"allowed": list(rules.models), "servers": list(rules.servers)} if rules.public else {})


def register() -> None:
    """Add /decode and /models to the Blocks being built (call inside `with gr.Blocks():`); decodes share the app's
    "decode" concurrency group."""
    gr.api(decode, api_name="decode", concurrency_id="decode", concurrency_limit=DECODE_QUEUE)
    gr.api(list_models, api_name="models", queue=False)
