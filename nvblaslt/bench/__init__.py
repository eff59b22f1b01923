"""``nvblaslt bench`` (``python -m nvblaslt bench``): benchmarks on the GPU, a consumer of the public
API and of a plan's ``Launch`` by its public names; nothing in the core imports it.

``cli`` parses the options and runs the sections in order; ``timing`` holds the bench's clocks (its
rounds through ``nvblaslt._timing.shuffled_rounds``); one module per section (``percall``,
``layer``, ``seed``, ``search``, ``mlp``, ``import_time``); ``report`` writes the JSON, the tables
and the chart; ``common`` holds what every section uses.

Benches of their own, each ``python -m nvblaslt.bench.NAME``: ``mlp``, ``conv``, ``grouped``, ``jax``,
``ragged`` (``nvblaslt.jax.ragged_dot`` against ``jax.lax.ragged_dot`` on MoE expert shapes), and
``tuning`` (the tuning database and batch invariance, issue 35's figures; ``tuning_problems``,
``tuning_recall`` and ``invariance`` are its parts).
"""
