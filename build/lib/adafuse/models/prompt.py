"""The text a model is conditioned on: the prompt as is (raw), or through the model's chat template (chat)."""
from __future__ import annotations

from .base import LoadedModel


def has_thinking_switch(lm: LoadedModel) -> bool:
    """The model's chat template reads `enable_thinking` (think first, or answer directly)."""
    return "enable_thinking" in str(getattr(lm.tokenizer, "chat_template", None) or "")


def render_prompt(lm: LoadedModel, prompt: str, mode: str, system: str = "",
                  thinking: bool | None = None, history: tuple = ()) -> tuple[str, str]:
    """The text model `lm` is conditioned on, and the mode actually used (the trace's prompt mode).

    Chat mode applies the model's chat template to the conversation `history` ((role, text) pairs, user and assistant
    taking turns) followed by `prompt` as the next user message: `system` as a system message (inside the first user
    message where the template refuses or drops a system role), `thinking` as its `enable_thinking` switch where it has
    one. Raw mode reads the prompt as is; chat mode without a template too, after the conversation written as a plain
    "User: …" / "Assistant: …" transcript where there is one. The mode says what was ignored."""
    ignored = [what for what, given in (("system prompt", system), ("thinking switch", thinking is not None),
                                        ("conversation", history and mode != "chat")) if given]
    if mode != "chat" or not lm.has_chat_template:
        why = ["no chat template"] if mode == "chat" else []
        why += ["conversation as a transcript"] if history and mode == "chat" else []
        why += [f"{' and '.join(ignored)} ignored"] if ignored else []
        text = transcript(history, prompt) if history and mode == "chat" else prompt
        return text, "raw" + (f" ({'; '.join(why)})" if why else "")
    from jinja2 import TemplateError
    tok, used, kw = lm.tokenizer, [], {}
    if thinking is not None:
        if has_thinking_switch(lm):
            kw["enable_thinking"] = thinking
        used.append(f"thinking {'on' if thinking else 'off'}" if kw else "no thinking switch")

    def apply(messages: list[dict]) -> str:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)

    turns = [{"role": role, "content": text} for role, text in history] + [{"role": "user", "content": prompt}]
    text = apply(turns)
    if system:
        try:
            with_system = apply([{"role": "system", "content": system}, *turns])
        except TemplateError:  # e.g. "System role not supported"
            with_system = text
        if with_system != text:
            text = with_system
            used.insert(0, "system")
        else:  # refused or silently dropped: the first user message carries it
            first = {"role": "user", "content": f"{system}\n\n{turns[0]['content']}"}
            text = apply([first, *turns[1:]])
            used.insert(0, "system in user message")
    if history:
        used.append(f"{len(history)} earlier messages")
    bos = getattr(tok, "bos_token", None)
    if lm.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]  # we add BOS as an id ourselves
    return text, "chat" + (f" ({', '.join(used)})" if used else "")


def transcript(history: tuple, prompt: str) -> str:
    """A conversation as plain text, for a model without a chat template: one "User:"/"Assistant:" line per message,
    ending with the assistant's turn to write."""
    lines = [f"{role.capitalize()}: {text}" for role, text in history]
    return "\n".join([*lines, f"User: {prompt}", "Assistant:"])
