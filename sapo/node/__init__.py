"""A node's three services: how each part is built from its settings, and how each runs against Kafka.

- `build`: the one place that builds the generator's backend and round source, the sampler's core and
  the trainer from their settings (the services and the in-process swarm both use it).
- `generator` (+ `policy`, following the policy topic), `sampler` (+ `recovery`, reading back the
  batch topic on start), `trainer`: the services, each a thin wiring of the pure cores in
  `sapo.generator`, `sapo.sampler` and `sapo.trainer` to consumer loops, producers, health and
  metrics (`metrics`). `services/*/main.py` start them through `sapo.runtime.configure` and `serve`.
"""
