"""Hand-built traces for the model-free tests of reports, plots and explanations."""
from adafuse.trace import Candidate, ModelStep, Round, Trace


def two_rounds() -> Trace:
    r0 = Round(0, [ModelStep("a", "commit", [0.9, 0.8], [0], 3, 4, 0.1), ModelStep("b", "commit", [0.75], [0], 1, 1, 0.1)],
               [Candidate(" The sky", False, ["a", "b"], {}, {}, None, 2)], 0, 0, " The sky", 2, 0.2)
    r1 = Round(1, [ModelStep("a", "commit", [0.95], [0], 1, 1, 0.1), ModelStep("b", "explore", [0.2], [1, 2], 2, 6, 0.3)],
               [Candidate(" is", False, ["a"], {"a": 0.1, "b": 0.5}, {"a": 1, "b": 1}, 0.3, 1),
                Candidate(" was", False, ["b"], {"a": 2.0, "b": 0.4}, {"a": 1, "b": 1}, 1.2, 1),
                Candidate(" blue.\n", True, ["b"], {"a": 3.0, "b": 1.0}, {"a": 2, "b": 3}, 2.0, 1)],
               chosen=1, winner=0, text=" was", words=1, seconds=0.4, overridden=True)
    return Trace("Q", ["a", "b"], {"tau": 0.7, "max_words": 3}, {"a": "raw", "b": "raw"}, [r0, r1], " The sky was",
                 prefill={"a": {"prompt_tokens": 5, "forward_passes": 1, "tokens_fed": 5, "seconds": 0.05}})


def hand_trace() -> Trace:
    r0 = Round(0, [ModelStep("a", "commit", [0.9], [0]), ModelStep("b", "commit", [0.8], [0])],
               [Candidate(" The <b>sky", False, ["a", "b"], {}, {}, None, 2)], 0, 0, " The <b>sky", 2, 0.2)
    r1 = Round(1, [ModelStep("a", "commit", [0.95], [0]), ModelStep("b", "explore", [0.2], [1, 2])],
               [Candidate(" is", False, ["a"], {"a": 0.1, "b": 0.5}, {"a": 1, "b": 1}, 0.3, 1),
                Candidate(" was", False, ["b"], {"a": 2.0, "b": 0.4}, {"a": 1, "b": 1}, 1.2, 1),
                Candidate("", True, ["b"], {"a": 3.0, "b": 1.0}, {"a": 1, "b": 1}, 2.0, 0)],
               chosen=1, winner=0, text=" was", words=1, seconds=0.4, overridden=True)
    return Trace("Q", ["a", "b"], {"tau": 0.7}, {"a": "raw", "b": "raw"}, [r0, r1], " The <b>sky was")


def empty_trace(**round_kw) -> Trace:
    """A Flores De→En answer that ended at once: the end of the answer (one event per model) wins round 0 over every word."""
    steps = [ModelStep("smollm2", "explore", [0.02], [0, 1], 2, 6, 0.2), ModelStep("gemma", "explore", [0.23], [2], 2, 6, 0.3)]
    pool = [Candidate("", True, ["smollm2"], {"smollm2": 1.95, "gemma": 3.61}, {"smollm2": 1, "gemma": 1}, 2.78, 0,
                      end_term={"smollm2": -1.95, "gemma": -3.61}),
            Candidate(" The", False, ["smollm2"], {"smollm2": 2.96, "gemma": 3.76}, {"smollm2": 1, "gemma": 1}, 3.36, 1),
            Candidate(" A", False, ["gemma"], {"smollm2": 3.6, "gemma": 2.64}, {"smollm2": 1, "gemma": 1}, 3.12, 1)]
    r0 = Round(0, steps, pool, 0, 0, "", 0, 0.5, stop="end of answer", **round_kw)
    return Trace("Q", ["smollm2", "gemma"], {"tau": 0.7}, {"smollm2": "raw", "gemma": "raw"}, [r0], "",
                 stop_reason="end of answer")
