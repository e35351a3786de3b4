"""Prompts (adafuse/models/prompt.py): chat templates with a system prompt and the thinking switch, raw prompts, and
what each mode says it ignored; on SmolLM2's tokenizer with its own and other templates."""
import copy
import dataclasses
from dataclasses import replace

import pytest

from adafuse import DecodeConfig
from adafuse.models.prompt import TRANSCRIPT, TURN_ENDS, has_thinking_switch, render_prompt, with_turn_end


@pytest.fixture(scope="module")
def smol(pair):
    return pair[0]  # SmolLM2-135M-Instruct: a chat template with a default system message


THINKING_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
                     "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")


NO_SYSTEM_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
                      "supported') }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>")


def _with_template(lm, template: str):
    """The same model with a copy of its tokenizer that has another chat template."""
    tok = copy.deepcopy(lm.tokenizer)
    tok.chat_template = template
    return dataclasses.replace(lm, tokenizer=tok)


def test_chat_system_prompt_comes_before_the_user_message(smol):
    text, mode = render_prompt(smol, "What is 2+2?", "chat", system="Answer with one number.")
    assert mode == "chat (system)"
    assert text.index("<|im_start|>system\nAnswer with one number.") < text.index("<|im_start|>user\nWhat is 2+2?")
    assert "You are a helpful AI assistant" not in text  # it replaces the template's default system message
    assert render_prompt(smol, "What is 2+2?", "chat")[1] == "chat"
    # raw mode reads the prompt as is, and says what it ignored
    assert render_prompt(smol, "Q", "raw", system="S") == ("Q", "raw (system prompt ignored)")
    assert render_prompt(smol, "Q", "raw", thinking=False) == ("Q", "raw (thinking switch ignored)")
    # chat without a template: a User/Assistant transcript, the system prompt first (a base model answers there)
    plain = _with_template(smol, None)
    assert render_prompt(plain, "Q", "chat") == ("User: Q\nAssistant:", TRANSCRIPT)
    assert render_prompt(plain, "Q", "chat", system="S") == ("S\n\nUser: Q\nAssistant:", TRANSCRIPT)
    assert render_prompt(plain, "Q", "chat", thinking=True)[1] == TRANSCRIPT + "; thinking switch ignored"


def test_a_template_without_a_system_role_gets_it_in_the_user_message(smol):
    lm = _with_template(smol, NO_SYSTEM_TEMPLATE)
    text, mode = render_prompt(lm, "What is 2+2?", "chat", system="Be brief.")
    assert text == "<|user|>Be brief.\n\nWhat is 2+2?\n<|assistant|>" and mode == "chat (system in user message)"


def test_the_thinking_switch_reaches_templates_that_have_it(smol):
    lm = _with_template(smol, THINKING_TEMPLATE)
    assert has_thinking_switch(lm) and not has_thinking_switch(smol)
    on, off, default = (render_prompt(lm, "Hi", "chat", thinking=t) for t in (True, False, None))
    assert off[0].endswith("<think></think>") and not on[0].endswith("</think>") and default[0] == on[0]
    assert (on[1], off[1], default[1]) == ("chat (thinking on)", "chat (thinking off)", "chat")
    # a template without the switch is rendered as without the setting, and the mode says so
    assert render_prompt(smol, "Hi", "chat", thinking=False) == (render_prompt(smol, "Hi", "chat")[0],
                                                                 "chat (no thinking switch)")


def test_a_conversation_is_rendered_by_the_template_before_the_next_user_message(smol):
    history = (("user", "What is 2+2?"), ("assistant", "4"))
    text, mode = render_prompt(smol, "And 3+3?", "chat", system="Be brief.", history=history)
    assert mode == "chat (system, 2 earlier messages)"
    marks = ["<|im_start|>system\nBe brief.", "<|im_start|>user\nWhat is 2+2?", "<|im_start|>assistant\n4",
             "<|im_start|>user\nAnd 3+3?"]
    assert [text.index(m) for m in marks] == sorted(text.index(m) for m in marks)
    assert text.endswith("<|im_start|>assistant\n")
    # without a system role the first user message carries the system prompt
    lm = _with_template(smol, NO_SYSTEM_TEMPLATE)
    text, mode = render_prompt(lm, "And 3+3?", "chat", system="Be brief.", history=history)
    assert text == "<|user|>Be brief.\n\nWhat is 2+2?\n<|assistant|>4\n<|user|>And 3+3?\n<|assistant|>"
    # no template: a plain transcript; raw mode: the prompt alone, saying the conversation was ignored
    plain = _with_template(smol, None)
    assert render_prompt(plain, "And 3+3?", "chat", history=history) == (
        "User: What is 2+2?\nAssistant: 4\nUser: And 3+3?\nAssistant:",
        TRANSCRIPT)
    assert render_prompt(smol, "Q", "raw", history=history) == ("Q", "raw (conversation ignored)")


def test_a_transcripts_turn_ends_at_the_next_user_line(smol):
    """Chat mode with a member that has no template: the decode stops where that member's turn ends (its next
    "User:" or "Assistant:" line), stop strings like any other (scored as the end of the answer); not in raw mode, nor when every
    model has a template, nor twice."""
    plain = _with_template(smol, None)
    chat = DecodeConfig(mode="chat")
    assert with_turn_end(chat, [smol, plain]).stop == TURN_ENDS
    assert with_turn_end(replace(chat, stop=("\n\n",)), [smol, plain]).stop == ("\n\n", *TURN_ENDS)
    assert with_turn_end(with_turn_end(chat, [plain]), [plain]).stop == TURN_ENDS
    assert with_turn_end(chat, [smol]) is chat and with_turn_end(DecodeConfig(), [plain]).stop == ()
