"""AdaFuse Explorer: the Gradio UI (layout, callbacks) and pure Plotly builders."""
