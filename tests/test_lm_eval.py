"""lm-evaluation-harness on this project's tasks (adafuse/harness/lm_eval_tasks/) both ways: the `adafuse` lm-eval model
(adafuse/harness/lm_eval_model.py) and lm-eval's own `local-completions` model pointed at `adafuse serve`. The toy pair
in-process (unit), and the real lm_eval command line on the bundled pair (models); both give what `adafuse eval`
gives on the same lines."""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from adafuse import DEFAULT_PAIR
from adafuse.config import DecodeConfig
from adafuse.errors import ConfigError
from adafuse.harness import lm_eval_model
from adafuse.harness.evaluate import evaluate, parse_methods, read_rows
from adafuse.harness.lm_eval_model import AdaFuseLM
from adafuse.harness.lm_eval_tasks import HERE as TASKS_DIR, load_docs, process_results, task_name, write_yamls
from adafuse.harness.metrics import corpus_scores
from adafuse.harness.tasks import SAMPLE_DATA, TASKS
from tests.toy_tasks import ToyRegistry, toy_data, toy_pair_for, toy_qa_pair

MODEL_ARGS = f"models={'+'.join(DEFAULT_PAIR)},tau=0.7,max_words=3,branches=3"
LINES = 2  # TriviaQA lines both harnesses decode, through the command line (the server path too)


def _samples(out_dir, task: str) -> list[dict]:
    """lm-eval's --log_samples rows of `task` under --output_path, in data order."""
    paths = list(out_dir.rglob(f"samples_{task}_*.jsonl"))
    assert len(paths) == 1, f"expected one samples file for {task} under {out_dir}: {paths}"
    return sorted((json.loads(line) for line in paths[0].read_text().splitlines()), key=lambda r: r["doc_id"])


def _lm_eval(args: list[str], tmp_path, command: list[str], tasks=("triviaqa",)) -> list[dict] | dict[str, list]:
    """Run an lm-eval command line on shipped YAMLs (the sample data) and return its samples (by task when several).
    `command` is ["adafuse", "lm-eval"] (`python -m adafuse lm-eval`) or ["lm_eval"] (`python -m lm_eval`): its entry
    point runs in this process (no new interpreter importing torch and lm-eval again; its model loads its members into
    a registry of its own, as on the command line), in a thread of its own (tests/test_cli.py starts `python -m
    adafuse` as a process of its own)."""
    from lm_eval.__main__ import cli_evaluate
    from adafuse.cli import main
    argv = ["run", *args, "--include_path", str(TASKS_DIR), "--tasks", ",".join(task_name(t) for t in tasks),
            "--metadata", json.dumps({"data": str(SAMPLE_DATA)}), "--log_samples", "--output_path", str(tmp_path / "out")]
    saved_argv = sys.argv

    def entry() -> int:
        if command == ["adafuse", "lm-eval"]:
            return main(["lm-eval", *argv])
        sys.argv = ["lm-eval", *argv]
        return cli_evaluate() or 0

    try:  # in a thread of its own: local-completions calls asyncio.run(), refused where a test left a loop running
        with ThreadPoolExecutor(1) as pool:
            code = pool.submit(entry).result()
    finally:
        sys.argv = saved_argv
    assert code == 0, f"{' '.join(command + argv)} exited {code}"
    if len(tasks) == 1:
        return _samples(tmp_path / "out", task_name(tasks[0]))
    return {t: _samples(tmp_path / "out", task_name(t)) for t in tasks}


def _same_as_eval(samples: list[dict], rows: list[dict]) -> None:
    """Each lm-eval sample is `adafuse eval`'s row of that data line: generation, extracted answer and exact match."""
    assert [s["doc"]["line"] for s in samples] == [r["line"] for r in rows[:len(samples)]]
    for s, r in zip(samples, rows):
        assert s["doc"]["prompt"] == r["trace"]["prompt"]
        assert s["resps"][0][0] == r["trace"]["output"], f"line {r['line']}"
        assert TASKS[r["task"]].extract(s["filtered_resps"][0]) == r["prediction"]
        assert s["em"] == r["scores"]["em"]


# ---- unit: the YAMLs, their hooks, and lm-eval driving the toy pair in-process ----

def test_the_shipped_yamls_are_written_from_the_task_table(tmp_path):
    written = write_yamls(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in TASKS_DIR.glob("*.yaml"))
    for p in written:
        assert p.read_text() == (TASKS_DIR / p.name).read_text(), \
            f"{p.name} is stale: rerun python -m adafuse.harness.lm_eval_tasks"


def test_a_command_line_naming_only_shipped_tasks_reads_only_their_folder():
    """`python -m adafuse lm-eval` skips lm-eval's index of its own tasks (10 s) when every task named is shipped here
    and read from this project's folder; any other task, folder or none keeps lm-eval's whole index."""
    ours = ["run", "--model", "adafuse", "--include_path", str(TASKS_DIR)]
    assert lm_eval_model.shipped_only([*ours, "--tasks", "adafuse_triviaqa,adafuse_flores_en_ppl"])
    assert lm_eval_model.shipped_only(["run", f"--include_path={TASKS_DIR}", "--tasks=adafuse_nq"])
    assert not lm_eval_model.shipped_only([*ours, "--tasks", "adafuse_triviaqa,hellaswag"])
    assert not lm_eval_model.shipped_only(["run", "--tasks", "adafuse_triviaqa"])
    assert not lm_eval_model.shipped_only(["run", "--include_path", "/elsewhere", "--tasks", "adafuse_triviaqa"])
    assert not lm_eval_model.shipped_only([*ours])


def test_docs_hold_the_lines_prompts_and_scores_of_adafuse_eval():
    for name, t in TASKS.items():
        docs = load_docs(name, data=str(SAMPLE_DATA), version=1.0)["test"]
        head = (SAMPLE_DATA / t.folder / t.prompt_file).read_text()
        lines = [json.loads(x) for x in (SAMPLE_DATA / t.folder / t.file).read_text().splitlines()]
        assert list(docs["line"]) == list(range(1, len(lines) + 1))
        doc = docs[1]
        assert doc["prompt"] == t.prompt(head, lines[1]["question"]) and doc["max_new_words"] == t.max_new_words
        gold = lines[1]["answer"]
        ref = gold if isinstance(gold, str) else gold[0]
        scored = process_results(doc, [f" {ref}\n\nQuestion: more"])
        if t.metric == "translation":
            assert scored == {"bleu": (ref, ref), "chrf": (ref, ref)}
        else:
            assert scored == t.score(t.extract(f" {ref}\n\nQuestion: more"), gold) and max(scored.values()) == 1.0


def test_flores_is_scored_on_the_corpus_as_adafuse_eval_does():
    from adafuse.harness.lm_eval_tasks import corpus_bleu, corpus_chrf
    pairs = [("The cat sat on the mat.", "The cat sat on the mat."), ("A dog runs.", "The dog is running.")]
    want = corpus_scores([p for p, _ in pairs], [r for _, r in pairs])
    assert corpus_bleu(pairs) == want["bleu"] and corpus_chrf(pairs) == want["chrf"]


def test_lm_evals_own_models_stay_registered_beside_adafuse():
    """lm-eval imports its own models only while its registry is empty: registering `adafuse` first must not hide
    `hf` or `local-completions` from a Python session that imported adafuse's lm-eval model before using lm-eval."""
    from lm_eval.api.registry import get_model
    assert get_model("adafuse") is AdaFuseLM
    assert get_model("hf").__name__ == "HFLM" and get_model("local-completions")


def test_model_args_are_read_as_lm_eval_passes_them(monkeypatch):
    a, b = toy_qa_pair()
    monkeypatch.setattr(lm_eval_model.ModelRegistry, "get", lambda self, name, **kw: {"a": a, "b": b}[name])
    lm = AdaFuseLM.create_from_arg_string("models=a+b,tau=0.5,branches=2,weights=1/4,concurrency=2",
                                          {"batch_size": 1, "device": "cuda:0"})
    assert lm.models == [a, b] and lm.concurrency == 2
    assert (lm.config.tau, lm.config.branches, lm.config.weights) == (0.5, 2, (1.0, 4.0))
    cfg = lm.request_config({"until": ["\n"], "max_gen_toks": 40, "do_sample": False}, {"max_new_words": 7})
    assert (cfg.stop, cfg.max_new_tokens, cfg.max_new_words) == (("\n",), 40, 7)
    assert lm.request_config({"until": "\n\n"}, {}).max_new_words == DecodeConfig().max_new_tokens  # tokens decide
    for bad, says in (("models=a+b,tau=3", "tau=3"), ("models=a+b,stop=x", "stop"), ("models=a+b,foo=1", "foo"),
                      ("models=a+b,weights=1/2/3", "weights"), ("models=a", "2 to 4")):
        with pytest.raises(ConfigError, match=says):
            AdaFuseLM.create_from_arg_string(bad)


def test_lm_eval_decodes_the_toy_pair_as_adafuse_eval_does(tmp_path):
    a, b = toy_qa_pair()
    data = toy_data(tmp_path / "data", {(2, 2): "London"})
    rows = read_rows(evaluate(TASKS["nq"], parse_methods(["adafuse[weights=1/20]"], ["a", "b"]), tmp_path / "eval",
                              data, limit=4, progress=False, registry=ToyRegistry(a, b)))
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"data": str(data)})
    out = simple_evaluate(model=AdaFuseLM(models=[a, b], weights="1/20", concurrency=2), tasks=[task_name("nq")],
                          task_manager=manager, limit=4, log_samples=True)
    samples = sorted(out["samples"][task_name("nq")], key=lambda r: r["doc_id"])
    _same_as_eval(samples, rows)
    assert [r["prediction"] for r in rows] == ["London"] * 4  # b, weighed 20x, wins every line
    assert [s["em"] for s in samples] == [0.0, 1.0, 0.0, 0.0]
    assert out["results"][task_name("nq")]["em,none"] == 0.25


def test_every_shipped_yaml_runs_through_lm_eval_as_adafuse_eval_runs_it(tmp_path):
    """Every task, line 1 of the sample data, through lm-eval in-process (the shipped YAMLs, their hooks, lm-eval's
    filters and metrics) and `adafuse eval`, both decoding with a toy pair: the same prompt, output, extracted answer
    and per-line scores (Flores is scored on the corpus by both). The real pair goes through the real lm-eval command
    line below (TriviaQA)."""
    prompts = [load_docs(t, data=str(SAMPLE_DATA))["test"][0]["prompt"] for t in TASKS]
    a, b = toy_pair_for(prompts)
    rows = {t: read_rows(evaluate(TASKS[t], parse_methods(["adafuse"], ["a", "b"]), tmp_path / f"eval-{t}", SAMPLE_DATA,
                                  limit=1, progress=False, registry=ToyRegistry(a, b))) for t in TASKS}
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"data": str(SAMPLE_DATA)})
    out = simple_evaluate(model=AdaFuseLM(models=[a, b]), tasks=[task_name(t) for t in TASKS], task_manager=manager,
                          limit=1, log_samples=True)
    for t in TASKS:
        (sample,), (row,) = out["samples"][task_name(t)], rows[t]
        assert sample["doc"]["line"] == row["line"] == 1 and sample["doc"]["prompt"] == row["trace"]["prompt"], t
        assert sample["resps"][0][0] == row["trace"]["output"], t
        assert TASKS[t].extract(sample["filtered_resps"][0]) == row["prediction"], t
        if TASKS[t].metric != "translation":
            assert {k: sample[k] for k in row["scores"]} == row["scores"], t
    assert any(r[0]["trace"]["output"] for r in rows.values())  # answers with text, not only empty ones


def test_the_scored_tasks_run_through_lm_eval_on_the_ensemble_as_a_scorer():
    """The shipped multiple-choice and perplexity YAMLs through lm-eval in-process on a toy pair: acc and acc_norm
    from the fused log-likelihoods of each question's 4 answers, perplexities and bits per byte from the rolling ones
    (lm-eval's own metrics)."""
    from adafuse.harness.lm_eval_tasks.scored import SCORED, load_choice_docs, load_text_docs
    docs = load_choice_docs("triviaqa", str(SAMPLE_DATA))["test"].select(range(3))
    texts = load_text_docs("flores-en-de", str(SAMPLE_DATA))["test"].select(range(2))
    assert all(len(set(d["choices"])) == 4 and 0 <= d["gold"] < 4 for d in docs)
    a, b = toy_pair_for([d["prompt"] + " ".join(d["choices"]) for d in docs] + [d["text"] for d in texts])
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"data": str(SAMPLE_DATA)})
    out = simple_evaluate(model=AdaFuseLM(models=[a, b]), tasks=list(SCORED), task_manager=manager, limit=3)
    mc, ppl = out["results"]["adafuse_triviaqa_mc"], out["results"]["adafuse_flores_en_ppl"]
    assert 0 <= mc["acc,none"] <= 1 and 0 <= mc["acc_norm,none"] <= 1
    assert ppl["bits_per_byte,none"] > 0 and ppl["word_perplexity,none"] > 1


# ---- models: the real lm_eval command line on the bundled pair ----

@pytest.fixture(scope="module")
def eval_rows(pair, tmp_path_factory):
    """`adafuse eval --task triviaqa --methods adafuse` on the first LINES sample lines (the default registry: the
    session's pair)."""
    out = evaluate(TASKS["triviaqa"], parse_methods(["adafuse"], list(DEFAULT_PAIR)), tmp_path_factory.mktemp("eval"),
                   SAMPLE_DATA, limit=LINES, progress=False, concurrency=LINES)
    return read_rows(out)


@pytest.mark.models
def test_lm_eval_model_adafuse_gives_adafuse_evals_outputs_and_exact_match(eval_rows, tmp_path):
    samples = _lm_eval(["--model", "adafuse", "--model_args", MODEL_ARGS, "--limit", str(LINES)], tmp_path,
                       ["adafuse", "lm-eval"])
    assert len(samples) == LINES
    _same_as_eval(samples, eval_rows)


@pytest.mark.models
def test_lm_evals_local_completions_on_adafuse_serve_gives_adafuse_evals_outputs(eval_rows, adafuse_server,
                                                                                   tmp_path):
    """`python -m adafuse serve` (the session's, at the README's defaults) behind lm-eval's own `local-completions`
    model: lm-eval sends TriviaQA's stop strings and a token cap; its `--gen_kwargs` sends the ensemble's settings in
    each request's `adafuse` object, here TriviaQA's word cap (what the adafuse model takes from each doc)."""
    args = f"base_url={adafuse_server[0]}/v1/completions,model=adafuse,tokenizer_backend=None,num_concurrent=2," \
           "max_retries=1"
    words = json.dumps({"adafuse": {"max_new_words": TASKS["triviaqa"].max_new_words}})
    samples = _lm_eval(["--model", "local-completions", "--model_args", args, "--gen_kwargs", words, "--limit", "2"],
                       tmp_path, ["lm_eval"])
    assert len(samples) == 2
    _same_as_eval(samples, eval_rows)


# ---- models: the ensemble as a scorer against lm-eval's own `hf` model ----

def _scoring_requests():
    """loglikelihood requests from the shipped multiple-choice task (the sample data), a context ending in a space and
    one ending mid-word (where a tokenizer merges across the boundary), and an empty context; rolling requests from the
    perplexity task."""
    from lm_eval.api.instance import Instance
    from adafuse.harness.lm_eval_tasks.scored import load_choice_docs, load_text_docs
    docs = load_choice_docs("triviaqa", str(SAMPLE_DATA))["test"].select(range(1))
    pairs = [(d["prompt"], " " + c) for d in docs for c in d["choices"]]
    pairs += [("Question: Who wrote Hamlet?\nAnswer: ", "William Shakespeare"), ("The capital of France is Par", "is, a city of light"),
              ("", "Paris is the capital of France.")]
    texts = [d["text"] for d in load_text_docs("flores-en-de", str(SAMPLE_DATA))["test"].select(range(1))]
    return ([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)],
            [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])


@pytest.mark.models
@pytest.mark.parametrize("member", range(len(DEFAULT_PAIR)))
def test_one_member_scores_as_lm_evals_hf_model_on_that_model(pair, member):
    """The `adafuse` model with one member gives, request by request, the log-likelihood and greedy flag lm-eval's
    `hf` model gives for that model (fp32 on the CPU, within 1e-4), and the same rolling log-likelihoods."""
    from lm_eval.models.huggingface import HFLM
    from adafuse.models.local import bundled_folder
    hf = HFLM(pretrained=str(bundled_folder(DEFAULT_PAIR[member])), dtype="float32", device="cpu", batch_size=4)
    ours = AdaFuseLM(models=[pair[member]], method="greedy", concurrency=1)
    choice, rolling = _scoring_requests()
    want, got = hf.loglikelihood(choice, disable_tqdm=True), ours.loglikelihood(choice, disable_tqdm=True)
    for req, (w, wg), (g, gg) in zip(choice, want, got):
        assert g == pytest.approx(w, abs=1e-4) and gg == wg, req.args
    want, got = hf.loglikelihood_rolling(rolling, disable_tqdm=True), ours.loglikelihood_rolling(rolling, True)
    assert got == pytest.approx(want, abs=1e-4)
