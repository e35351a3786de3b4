"""Stop strings (adafuse/stops.py): the stop box's escapes both ways, and stops proposed from a raw prompt's shape."""
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adafuse import ConfigError, DecodeConfig
from adafuse.harness.tasks import TASKS, data_dir
from adafuse.stops import ESCAPES, format_stops, parse_stops, propose_stops

pytestmark = pytest.mark.unit
ASSETS = Path(__file__).resolve().parents[1] / "assets"


def test_one_stop_string_a_line_with_escapes_decoded():
    assert parse_stops("\\n\\nQuestion:\n\\t\nC:\\\\dir\n Paris\n\n   \n") == ("\n\nQuestion:", "\t", "C:\\dir", " Paris")
    assert parse_stops("a\r\nb\r\n") == ("a", "b")  # Windows line ends
    assert parse_stops("\\r\\n") == ("\r\n",)
    assert parse_stops("") == parse_stops(None) == ()
    assert parse_stops("\\\\n") == ("\\n",)  # an escaped backslash, then a plain n


@pytest.mark.parametrize("text,named", [
    ("\\q", "unknown escape \\q"),
    ("A\n\\x41", "line 2 (\\x41) has an unknown escape \\x"),
    ("end\\", "lone \\ at its end"),
    ("\\boxed{", "unknown escape \\b"),  # write \\boxed{ for the backslash itself
])
def test_an_unknown_escape_is_refused_with_the_escapes_there_are(text, named):
    with pytest.raises(ConfigError) as err:
        parse_stops(text)
    msg = str(err.value)
    assert named in msg and all(f"\\{k}" in msg for k in ESCAPES)


STOPS = st.lists(st.text(alphabet=st.sampled_from("ab :Q\\\n\t\r \u2028\x0b\x85\u00e9"), min_size=1), max_size=4)


@given(stops=STOPS)
def test_format_and_parse_round_trip(stops):
    """Every stop string a line can hold comes back exactly (line breaks of other kinds, spaces, backslashes
    included); one it cannot hold (only spaces: a blank line is skipped) is refused, not lost."""
    try:
        text = format_stops(stops)
    except ConfigError:
        assert any(not s.replace("\t", "x").replace("\n", "x").replace("\r", "x").strip() for s in stops)
        return
    assert parse_stops(text) == tuple(stops)
    assert len(text.split("\n")) == len(stops) or not stops  # one a line


def test_format_stops_shows_a_traces_stops_in_the_box():
    assert format_stops(["\n\nQuestion:", "\t", "a\\b"]) == "\\n\\nQuestion:\n\\t\na\\\\b"
    assert format_stops(()) == ""
    with pytest.raises(ConfigError, match="visible character"):
        format_stops(["  "])


@pytest.mark.parametrize("prompt,stops", [
    # the answer to follow on the cue's line: the line break ends it (the models' next line is another example, a
    # list or another language, wherever they do not stop there)
    ("Question: Who wrote Hamlet?\nAnswer:", ("\n",)),
    ("Question: Who wrote Hamlet?\nAnswer: ", ("\n",)),
    ("Q: What is 2+2?\nA:", ("\n",)),
    ("German: Das Wetter ist heute schön.\nEnglish:", ("\n",)),
    ("Translate to German.\nEnglish: Hello\nGerman:", ("\n",)),  # the example starts past the instruction
    ("Q: a\nA: b\nQ: c\nA:", ("\n",)),  # examples without blank lines between them, one-line answers
    # answers over lines: the label of the line that starts the last example
    ("Q: 1+1?\nA: 2\nQ: 2+3?\nA: Let me see.\n5\nQ: 3+3?\nA:", ("\nQ:",)),
    ("Question: 1+1?\nLet's think step by step\n1 + 1 = 2.\nThe answer is 2.\n\nQuestion: 2+3?\n"
     "Let's think step by step\n", ("\nQuestion:",)),
    ("Question:\nWho wrote Hamlet?\nAnswer:\n", ("\nQuestion:",)),  # the answer on the next line, no example yet
    ("Question:\nWho wrote Hamlet?\nAnswer:\nShakespeare\n\nQuestion:\nWho wrote Faust?\nAnswer:\n", ("\n",)),
    ("Intro.\n\nPassage: It was built in 1871.\nQuestion: When was it built?\nAnswer:\n",
     ("\nPassage:", "\nQuestion:")),  # every line labelled: the next example starts with one of them
    ("Q: what is 2+2?", ("\nQ:",)),
    # a question with no label of its own, then a cue label: the answer follows on the cue's line too
    ("Who wrote Hamlet?\nAnswer:", ("\n",)),
    ("Wer schrieb Hamlet?\nAntwort:", ("\n",)),
    # no label: a bare question is answered after "\n\n" (a line-break stop would leave it empty); text to continue
    ("Who wrote Hamlet?", ()),
    ("Summarize the plot of Hamlet:", ()),
    ("What is 2+2? Answer:", ()),
    ("Once upon a time", ()),
    ("The capital of France is", ()),
    ("Name three primary colors and say one thing about each.", ()),
    ("Chapter 1\nIt was a dark night.\n", ()),
    ("Note: the weather is nice and", ()),
    ("", ()),
])
def test_stops_proposed_from_a_raw_prompt(prompt, stops):
    assert propose_stops(prompt) == stops
    DecodeConfig(stop=stops)  # a valid setting


# labels in any script, with the colon each writes: full-width (no space after it), a space or a no-break space before
# it, vowel signs (combining marks) inside the label
OTHER_LANGUAGES = {
    "質問：ハムレットを書いたのは誰ですか？\n答え：": ("\n",),
    "ハムレットを書いたのは誰ですか？\n答え：": ("\n",),
    "问题：谁写了哈姆雷特？\n答案：": ("\n",),
    "問題：日本の首都は？\n答え：東京\n\n問題：ハムレットを書いたのは誰ですか？\n答え：": ("\n",),
    "問題：1+1は？\n答え：考えます。\n2\n\n問題：2+3は？\n答え：": ("\n問題：",),  # answers over lines
    "Question\u00a0: Qui a écrit Hamlet\u00a0?\nRéponse\u00a0:": ("\n",),
    "Qui a écrit Hamlet ?\nRéponse :": ("\n",),
    "सवाल: हेमलेट किसने लिखा?\nजवाब:": ("\n",),
}


def test_stops_proposed_for_frames_in_other_languages():
    assert {prompt: propose_stops(prompt) for prompt in OTHER_LANGUAGES} == OTHER_LANGUAGES
    # not labels: a sentence ending in a colon (many words, or many Chinese or Japanese characters), a colon mid-line
    # nor a question and a cue label with the answer on the next line (a line break would end it at once)
    for prompt in ("これは長い文で説明しています：\n答え：", "ハムレットを書いたのは誰？答え：", "See http://x.org:\nAnswer:",
                   "Who wrote Hamlet?\nAnswer:\n"):
        assert propose_stops(prompt) == (), prompt


def test_a_passages_own_colons_are_not_labels():
    prompt = "Passage: The Normans (Norman: Nourmands) came.\nNote, however: it rained.\nQuestion: Who came?\nAnswer:\n"
    assert propose_stops(prompt) == ("\nPassage:",)  # a middle line without a label: the labels are not a form


def test_the_shipped_examples_get_their_own_stops():
    """Every raw example gets the stop it ships with, or (a worked answer over lines) the same label after one line
    break instead of two."""
    for ex in json.loads((ASSETS / "examples.json").read_text(encoding="utf-8")):
        if ex["mode"] != "raw":
            continue
        proposed, shipped = propose_stops(ex["prompt"]), parse_stops(ex["stop"])
        assert proposed == shipped or _same_labels(proposed, shipped), ex["label"]


# per task: the stop proposed from its prompt (the task's own, but for one line break before "Question:")
TASK_STOPS = {name: ("\n",) for name in TASKS} | {"gsm8k": ("\nQuestion:",)}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_task_prompt_gets_the_tasks_own_stop(name):
    task = TASKS[name]
    head = (data_dir() / task.folder / task.prompt_file).read_text(encoding="utf-8")
    with open(data_dir() / task.folder / task.file, encoding="utf-8") as f:
        question = json.loads(f.readline())["question"]
    proposed = propose_stops(task.prompt(head, question))
    assert proposed == TASK_STOPS[name] and (proposed == task.stop or _same_labels(proposed, task.stop))


def _same_labels(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same labels, after however many line breaks ("\\nQuestion:" and "\\n\\nQuestion:")."""
    return all(x.strip() for x in a + b) and [x.strip() for x in a] == [x.strip() for x in b]


def test_a_bare_question_is_told_from_a_framed_one():
    """A question typed as asked (no label, ending with a question mark, in any script) gets the app's hint; a framed
    prompt, a text to continue or a labelled question does not. The frame it offers gets the "\\n" stop."""
    from adafuse.stops import bare_question, qa_frame
    for bare in ("Who wrote Hamlet?", "  Who wrote Hamlet?\n", "東京はどこですか？", "Hi.\nWho are you?"):
        assert bare_question(bare), bare
    for not_bare in ("", "Question: Who wrote Hamlet?", "Who wrote Hamlet?\nAnswer:", "The capital of France is",
                     "Q: 2+2?", "a\nb\nc?"):
        assert not bare_question(not_bare), not_bare
    assert qa_frame(" Who wrote\nHamlet? ") == "Question: Who wrote Hamlet?\nAnswer:"
    assert propose_stops(qa_frame("Who wrote Hamlet?")) == ("\n",)
