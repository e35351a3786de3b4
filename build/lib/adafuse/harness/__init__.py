"""The evaluation harness beside the decoder, for any models and method labels: tasks, metrics, `evaluate` (python -m
adafuse eval), comparisons on the same examples (`compare`), trace statistics (`stats`), the benchmark (python -m
adafuse.harness.bench), the GPU check and the Plotly figures. The studies built on it live in experiments/."""
