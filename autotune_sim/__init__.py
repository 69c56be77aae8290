"""The simulated GPU engine: a real HTTP server process that stands in for vLLM or SGLang.

``python -m autotune_sim vllm --model <preset> [vLLM flags]`` and ``python -m autotune_sim sglang
--model-path <preset> [SGLang flags]`` accept the real engine's flags, print its log lines and
serve its endpoints and metrics, backed by a performance model of a GPU (``memory.py`` for what
fits, ``perf.py`` for how long a step takes, ``scheduler.py`` for continuous batching, paged KV
and preemption). Every number it reports is modelled, and it says so at start-up.

Start-up reuse as the real engines do it: ``python -m autotune_sim vllm preload ...`` is vLLM
0.34's weight-cache daemon (engines map it with ``--load-format ipc_cache``), ``python -m
autotune_sim sglang-weight-cache ...`` is SGLang 0.5.23's (``--weight-cache-mode client``), and
vLLM's torch.compile cache under ``VLLM_CACHE_ROOT`` makes a start with a known compile key warm.

Modules: ``presets`` (GPUs, models), ``settings`` (``AUTOTUNE_SIM_*``), ``memory``, ``perf``,
``kvcache``, ``scheduler``, ``engine`` (modelled clock), ``tokenizer``, ``http``, ``openai``,
``stats``/``metrics``, ``weight_cache`` (the daemons' socket), ``compile_cache``, ``dialects/``
(vllm, vllm_preload, vllm_ipc, sglang, sglang_weight_cache), ``app`` (entry point), ``offline`` (a
workload through the model without a server), ``calibration`` (the model against published
facts). Importing this package imports nothing else, so the server starts in a fraction of a
second.
"""
