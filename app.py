"""AdaFuse Explorer: `python app.py` serves the UI on the embedded default pair (Hugging Face Spaces entry point)."""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from app.ui import CSS, build_demo  # noqa: E402  (import from app.* at the top: reload mode swaps "app")

demo = build_demo()

if __name__ == "__main__":
    demo.queue(default_concurrency_limit=2, max_size=32).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("PORT", os.environ.get("GRADIO_SERVER_PORT", 7860))), css=CSS)
