"""Benchmark tasks (adafuse/harness/tasks.py): answer extraction, data errors with line numbers, the bundled sample."""
import pytest

from adafuse.harness import tasks
from adafuse.harness.tasks import TASKS, DataError, read_examples


def test_extraction_cuts_continuations():
    qa, gsm = TASKS["nq"], TASKS["gsm8k"]
    assert qa.extract(" Paris.\n\nQuestion: next?\nAnswer: x") == "Paris."
    assert qa.extract(" Paris Question: more") == "Paris"
    assert gsm.extract("2 + 2 = 4\nThe answer is \\boxed{4}\n\nQuestion: next") == "2 + 2 = 4\nThe answer is \\boxed{4}"
    assert TASKS["flores-de-en"].score("The weather is nice.", "The weather is nice.")["bleu"] > 99


def test_bad_data_lines_are_reported_with_their_number(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "q1", "answer": ["a"]}\nnot json\n{"question": "q3"}\n{"question": "q4", "answer": "b"}\n')
    seen = []
    rows = read_examples(path, 10, "skip", seen.append)
    assert [no for no, _ in rows] == [1, 4]
    assert any("line 2" in m for m in seen) and any("line 3" in m for m in seen) and any("fewer than" in m for m in seen)
    with pytest.raises(DataError, match="line 2"):
        read_examples(path, 10, "stop", seen.append)


def test_sample_data_when_the_full_sets_are_missing(monkeypatch, tmp_path):
    monkeypatch.delenv("ADAFUSE_DATA", raising=False)
    assert tasks.data_dir(roots=(tmp_path,)) == tasks.SAMPLE_DATA
    assert tasks.data_source(tasks.SAMPLE_DATA).startswith("sample")
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert tasks.data_dir(roots=(tmp_path,)) == tmp_path / "shared" / "data"
    assert tasks.data_source(tmp_path / "shared" / "data").startswith("full")
    size = sum(f.stat().st_size for f in tasks.SAMPLE_DATA.rglob("*") if f.is_file())
    assert size < 1_000_000
    full = tasks.data_dir()
    for task in tasks.TASKS.values():
        sample = tasks.read_examples(tasks.SAMPLE_DATA / task.folder / task.file, None)
        assert len(sample) == 20 and (tasks.SAMPLE_DATA / task.folder / task.prompt_file).is_file()
        if full != tasks.SAMPLE_DATA:  # the sample is the head of the full set, line numbers included
            assert sample == tasks.read_examples(full / task.folder / task.file, 20)
            assert (tasks.SAMPLE_DATA / task.folder / task.prompt_file).read_text() == \
                (full / task.folder / task.prompt_file).read_text()


def test_line_ranges_select_data_lines_by_number(tmp_path):
    """`--lines 51-100`: the validation lines, by their number in the file (bad and blank lines keep their numbers)."""
    assert tasks.parse_lines("51-100") == (51, 100) and tasks.parse_lines(" 7 ") == (7, 7)
    assert tasks.format_lines(tasks.VALIDATION_LINES) == "51-100"
    assert tasks.REPORT_LINES[1] < tasks.VALIDATION_LINES[0] <= tasks.VALIDATION_LINES[1] < tasks.TRAIN_OFFSET
    for bad in ("0-3", "5-4", "a-b", "", "3-"):
        with pytest.raises(tasks.ConfigError, match="FIRST-LAST"):
            tasks.parse_lines(bad)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"question": "q{i}", "answer": "a"}}\n' if i != 3 else "\n" for i in range(1, 8)))
    seen = []
    assert [no for no, _ in read_examples(path, None, lines=(2, 5), warn=seen.append)] == [2, 4, 5]
    assert [no for no, _ in read_examples(path, 2, lines=(2, 5), warn=seen.append)] == [2, 4]
    assert seen == ["d.jsonl holds 3 usable examples in lines 2-5: using 3"]  # line 3 is blank
    seen.clear()
    assert read_examples(path, 5, lines=(6, 9), warn=seen.append) == [(6, {"question": "q6", "answer": "a"}),
                                                                     (7, {"question": "q7", "answer": "a"})]
    assert seen == ["d.jsonl holds 2 usable examples in lines 6-9, fewer than --limit 5: using 2"]
