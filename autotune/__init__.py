"""autotune: a closed-loop auto-tuner for LLM serving engines (vLLM, SGLang)."""

__all__ = ["__version__"]
__version__ = "0.1.0"
