"""A bug corpus for the conformance suite: clean engines written from scratch and mutants of them.

- :mod:`.pool`: ``PoolEngine``, a vLLM-v1-style block pool (own key encoding, spec policies and
  physical ids: profile ``exact``);
- :mod:`.tree`: ``TreeEngine``, an SGLang-style radix tree over pages (profile ``maximal``);
- :mod:`.mutants`: one subclass per publicly reported bug class, with the profile, the expected
  property and the shortest exposing sequence of each (``MUTANTS``);
- :mod:`.variants`: correct tree variants the baseline suite flags (false positives);
- :mod:`.measure`: the kill measurements (``python -m corpus.measure`` from ``tests/``), whose
  table is in ``conformance/README.md`` (``KILLS.md``: the baseline before the runner rewrite).

Neither engine is based on ``pagedprefix.impl`` or the spec; they use the spec's validation
helpers and typed errors only.
"""
