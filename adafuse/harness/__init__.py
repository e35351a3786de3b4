"""The evaluation harness beside the decoder: tasks, metrics, `evaluate` (python -m adafuse eval), the results
report (python -m adafuse.harness.results), the benchmark (python -m adafuse.harness.bench) and the Plotly
figures the report and the app share."""
