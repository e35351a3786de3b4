"""The text a model is conditioned on: the prompt as is (raw), or through the model's chat template (chat)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from .base import LoadedModel

if TYPE_CHECKING:
    from ..config import DecodeConfig

TURN_ENDS = ("\nUser:", "\nAssistant:")  # a transcript's assistant turn ends where the next role line starts
TRANSCRIPT = "chat (no chat template: a User/Assistant transcript)"  # the prompt mode of such a model


def has_thinking_switch(lm: LoadedModel) -> bool:
    """The model's chat template reads `enable_thinking` (think first, or answer directly)."""
    return "enable_thinking" in str(getattr(lm.tokenizer, "chat_template", None) or "")


def render_prompt(lm: LoadedModel, prompt: str, mode: str, system: str = "",
                  thinking: bool | None = None, history: tuple = ()) -> tuple[str, str]:
    """The text model `lm` is conditioned on, and the mode actually used (the trace's prompt mode).

    Chat mode applies the model's chat template to the conversation `history` ((role, text) pairs, user and assistant
    taking turns) followed by `prompt` as the next user message: `system` as a system message (inside the first user
    message where the template refuses or drops a system role), `thinking` as its `enable_thinking` switch where it has
    one. Raw mode reads the prompt as is. Chat mode without a template writes the conversation as a transcript
    ("User: …" / "Assistant: …" lines, the system prompt first, ending on "Assistant:"): its turn ends where the next
    "User:" or "Assistant:" line would start (`TURN_ENDS`, stop strings the decode adds: `with_turn_end`). The mode
    says what was ignored."""
    chat, templated = mode == "chat", lm.has_chat_template
    ignored = [what for what, given in (("system prompt", system and not chat),
                                        ("thinking switch", thinking is not None and not (chat and templated)),
                                        ("conversation", history and not chat)) if given]
    if not chat:
        return prompt, "raw" + (f" ({' and '.join(ignored)} ignored)" if ignored else "")
    if not templated:  # a plain transcript, its turn ending at the next role line (TURN_ENDS)
        why = [f"{' and '.join(ignored)} ignored"] if ignored else []
        return transcript(history, prompt, system), "; ".join([TRANSCRIPT, *why])
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


def transcript(history: tuple, prompt: str, system: str = "") -> str:
    """A conversation as plain text, for a model without a chat template: the system prompt, then one
    "User:"/"Assistant:" line per message, ending with the assistant's turn to write."""
    lines = [f"{role.capitalize()}: {text}" for role, text in history]
    return "\n".join([*([system, ""] if system else []), *lines, f"User: {prompt}", "Assistant:"])


def with_turn_end(config: DecodeConfig, models: Sequence[LoadedModel]) -> DecodeConfig:
    """`config` with the stop strings that end a transcript's turn (`TURN_ENDS`) when a model reads a chat prompt as
    a transcript (chat mode, no chat template): the fused answer ends where that member's turn ends, as a chat
    template's end-of-turn token ends the others'. Unchanged otherwise."""
    if config.mode != "chat" or all(lm.has_chat_template for lm in models):
        return config
    missing = tuple(s for s in TURN_ENDS if s not in config.stop)
    return replace(config, stop=(*config.stop, *missing)) if missing else config
