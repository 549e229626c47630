"""The ``vllm`` engine: a checkpoint served by vLLM's async engine inside Triton's Python backend.

    rules       what vLLM can serve (head size, architecture, reduction, tensor parallel), from the spec alone
                (standard library only: the web app checks a deployment with it too)
    support     those rules on this machine (its cores, vLLM installed), refused before export
    entry       a checkpoint → a Triton model-repository entry: the Hugging Face folder, model.py, serving.json
    triton_model  the Triton Python-backend model written as the entry's ``1/model.py`` (vLLM, numpy, tokenizers)

Nothing here imports vLLM: only the served model does, inside Triton.
"""
