"""HeadInfer Studio Gradio app (never imports torch)."""
