"""The built-in models named by `--model`: the tiny random test model and the pretrained GGUF import."""
