"""The text a model is conditioned on: the prompt as is (raw), or through the model's chat template (chat)."""
from __future__ import annotations

from .base import LoadedModel


def has_thinking_switch(lm: LoadedModel) -> bool:
    """The model's chat template reads `enable_thinking` (think first, or answer directly)."""
    return "enable_thinking" in str(getattr(lm.tokenizer, "chat_template", None) or "")


def render_prompt(lm: LoadedModel, prompt: str, mode: str, system: str = "",
                  thinking: bool | None = None) -> tuple[str, str]:
    """The text model `lm` is conditioned on, and the mode actually used (the trace's prompt mode).

    Chat mode applies the model's chat template: `system` as a system message (inside the user message where the
    template refuses or drops a system role), `thinking` as its `enable_thinking` switch where it has one. Raw mode,
    and chat mode without a template, read the prompt as is; the mode says what was ignored."""
    ignored = [what for what, given in (("system prompt", system), ("thinking switch", thinking is not None)) if given]
    if mode != "chat" or not lm.has_chat_template:
        why = ["no chat template"] if mode == "chat" else []
        why += [f"{' and '.join(ignored)} ignored"] if ignored else []
        return prompt, "raw" + (f" ({'; '.join(why)})" if why else "")
    from jinja2 import TemplateError
    tok, used, kw = lm.tokenizer, [], {}
    if thinking is not None:
        if has_thinking_switch(lm):
            kw["enable_thinking"] = thinking
        used.append(f"thinking {'on' if thinking else 'off'}" if kw else "no thinking switch")

    def apply(messages: list[dict]) -> str:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)

    user = {"role": "user", "content": prompt}
    text = apply([user])
    if system:
        try:
            with_system = apply([{"role": "system", "content": system}, user])
        except TemplateError:  # e.g. "System role not supported"
            with_system = text
        if with_system != text:
            text = with_system
            used.insert(0, "system")
        else:  # refused or silently dropped: the user message carries it
            text = apply([{"role": "user", "content": f"{system}\n\n{prompt}"}])
            used.insert(0, "system in user message")
    bos = getattr(tok, "bos_token", None)
    if lm.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]  # we add BOS as an id ourselves
    return text, "chat" + (f" ({', '.join(used)})" if used else "")
