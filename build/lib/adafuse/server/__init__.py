"""`adafuse serve`: a fused ensemble as one model behind an OpenAI-compatible HTTP API (app.py: `build_app`)."""
