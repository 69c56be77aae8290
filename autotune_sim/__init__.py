"""The simulated GPU engine: a real HTTP server process that stands in for vLLM or SGLang.

``python -m autotune_sim vllm --model <preset> [vLLM flags]`` and ``python -m autotune_sim sglang
--model-path <preset> [SGLang flags]`` accept the real engine's flags, print its log lines and
serve its endpoints and metrics, backed by a performance model of a GPU (``memory.py`` for what
fits, ``perf.py`` for how long a step takes, ``scheduler.py`` for continuous batching, paged KV
and preemption). Every number it reports is modelled, and it says so at start-up.

Modules: ``presets`` (GPUs, models), ``settings`` (``AUTOTUNE_SIM_*``), ``memory``, ``perf``,
``kvcache``, ``scheduler``, ``engine`` (modelled clock), ``tokenizer``, ``http``, ``openai``,
``stats``/``metrics``, ``dialects/`` (vllm, sglang), ``app`` (entry point), ``offline`` (a
workload through the model without a server), ``calibration`` (the model against published
facts). Importing this package imports nothing else, so the server starts in a fraction of a
second.
"""
