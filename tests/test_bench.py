"""The CPU benchmark (adafuse/harness/bench.py): each model timed on every thread and on its share."""
import pytest
import torch

from adafuse.harness import bench


def test_the_benchmark_measures_each_model_on_every_thread_and_on_its_share(pair, monkeypatch):
    if any(m.device.type != "cpu" for m in pair):
        with pytest.raises(ValueError, match="CPU"):
            bench.cpu_step_seconds(pair)
        return
    before, applied = torch.get_num_threads(), []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # a process with two threads, shared by two models
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (applied.append(n), real(n)))
    try:
        every, share, timings = bench.cpu_step_seconds(pair, context=32, steps=2)
    finally:
        real(before)  # the function put back what get_num_threads said (2); this process had `before`
    assert (every, share) == (2, 1)
    # per model: its threads set for the run on every thread, put back, then its share, put back
    assert applied == [2, 2, 1, 2] * len(pair)
    assert [t[0] for t in timings] == [m.name for m in pair] and all(a > 0 and b > 0 for _, a, b in timings)
    monkeypatch.undo()
    # the ratio: the slower model on its share over all models on every thread, added up
    assert bench.floor_ratio([("a", 0.030, 0.040), ("b", 0.040, 0.064)]) == pytest.approx(0.064 / 0.070)
    # the printed floor, from the timings just measured (not measured again)
    monkeypatch.setattr(bench, "cpu_step_seconds", lambda models, context, steps: (every, share, timings))
    lines = bench.side_by_side_floor(pair, context=32, steps=2)
    assert len(lines) == 2 + len(pair) and "at best the slower model's" in lines[-1]
    assert lines[1] == f"  {timings[0][0]}: {1000 * timings[0][1]:.1f} ms on 2 thread(s), {1000 * timings[0][2]:.1f} ms on 1"
    assert f"= {bench.floor_ratio(timings):.2f}×" in lines[-1]
