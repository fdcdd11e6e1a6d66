"""What per-node identity costs: signing on the generator, verification on the sampler's arrival path.

Real RolloutGroups (bench_sampler's builder: easy-profile questions, 8 completions, prompt ids,
per-token logprobs), padded to the paper's 256 new tokens per completion (~4 bytes of text per
token) and also at bench_sampler's 16, from `--nodes` node ids, each signed by its node's Ed25519
key. Passes alternate so machine noise hits every path alike; medians of `--rounds` passes:

- serialize (baseline of the generator side): `SerializeToString` per group; sign: the signed
  headers (`sapo.identity.Signer`) of the same group.
- arrival, unsigned (baseline of the sampler side, identity off): header prefilter, decode and
  validation, `Screen.check` in lazy mode (the cheapest arrival path); arrival, signed: the same
  with `TrustStore.identify` (SHA-256 of the payload, one Ed25519 verification) before decoding.

Target: one core verifies at least 800 groups/s, the load of a 1,000-node swarm at the paper's 8
groups per node and round with 10 s rounds (a fast GPU swarm; CPU rounds take tens of seconds).

    .venv/bin/python bench/bench_identity.py [--nodes 100] [--groups-per-node 10] [--rounds 5]

What it read: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from bench_sampler import build_group, screen_config

from sapo.identity import NodeKey, Sender, Signer, TrustStore
from sapo.sampler import Screen, SeenGroups, VerifyMode, header_reason, parse
from sapo.tasks import EASY_PROFILE, TaskStream
from sapo.v1 import rollout_pb2
from sapo.wire import H_NODE, rollout_headers

TARGET_GROUPS_PER_S = 800.0
Signed = tuple[bytes, dict[str, bytes]]
T = TypeVar("T")


def padded(group: rollout_pb2.RolloutGroup, tokens: int, rng: random.Random) -> rollout_pb2.RolloutGroup:
    """The group with every completion grown to `tokens` tokens (ids, logprobs, ~4 bytes of text each)."""
    for comp in group.completions:
        extra = tokens - len(comp.token_ids)
        comp.token_ids.extend(rng.randrange(49152) for _ in range(extra))
        comp.logprobs.extend(-rng.random() for _ in range(extra))
        comp.text = "w" * (4 * extra) + comp.text
    return group


def build(
    nodes: int, per_node: int, tokens: int, seed: int
) -> tuple[list[rollout_pb2.RolloutGroup], list[Signer]]:
    """`per_node` groups of each of `nodes` node ids, interleaved as a swarm sends them, and the
    nodes' signers."""
    rng = random.Random(seed)
    signers = [Signer(NodeKey.generate()) for _ in range(nodes)]
    streams = [TaskStream(EASY_PROFILE, node_seed=n, split="train") for n in range(nodes)]
    groups = [
        padded(build_group(f"node-{n}", streams[n], rng), tokens, rng)
        for _ in range(per_node)
        for n in range(nodes)
    ]
    return groups, signers


def per_group_us(items: Sequence[T], work: Callable[[T], object]) -> float:
    start = time.perf_counter()
    for item in items:
        work(item)
    return 1e6 * (time.perf_counter() - start) / len(items)


def measure(groups: list[rollout_pb2.RolloutGroup], signers: list[Signer], rounds: int) -> dict[str, float]:
    """Median microseconds per group of each path (module docstring), passes interleaved."""
    store = TrustStore()
    for n, signer in enumerate(signers):
        store.add(f"node-{n}", signer.key.public, "file")
    values = [g.SerializeToString() for g in groups]
    owners = [signers[int(g.node_id.removeprefix("node-"))] for g in groups]
    jobs = list(zip(groups, values, owners, strict=True))
    signed: list[Signed] = [(v, dict(rollout_headers(g, v, s))) for g, v, s in jobs]
    cfg = screen_config(None, VerifyMode.LAZY)
    now = time.time()

    def sign(job: tuple[rollout_pb2.RolloutGroup, bytes, Signer]) -> object:
        group, value, signer = job
        return signer.sign_headers(rollout_headers(group, value), value)

    def arrive(screen: Screen, message: Signed, verify: bool) -> object:
        value, headers = message
        if header_reason(headers, "external", cfg) is not None:
            raise AssertionError("the prefilter refused an honest group")
        sender = store.identify(headers, value, now) if verify else Sender(headers[H_NODE].decode())
        if not isinstance(sender, Sender):
            raise AssertionError(f"an honest group was refused: {sender}")
        return screen.check(parse(value, cfg.max_payload_bytes, headers), "external", now, 0, sender)

    def arrival(verify: bool) -> float:
        screen = Screen(cfg, SeenGroups(1_000_000))  # fresh dedupe state per pass
        return per_group_us(signed, lambda m: arrive(screen, m, verify))

    runs: dict[str, Callable[[], float]] = {
        "serialize": lambda: per_group_us(groups, lambda g: g.SerializeToString()),
        "sign": lambda: per_group_us(jobs, sign),
        "verify only": lambda: per_group_us(signed, lambda m: store.identify(m[1], m[0], now)),
        "arrival, unsigned": lambda: arrival(verify=False),
        "arrival, signed": lambda: arrival(verify=True),
    }
    passes: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            passes[name].append(run())
    return {name: statistics.median(us) for name, us in passes.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--groups-per-node", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    verified_rates = []
    for tokens in (16, 256):
        groups, signers = build(args.nodes, args.groups_per_node, tokens, seed=tokens)
        size = statistics.median(len(g.SerializeToString()) for g in groups)
        us = measure(groups, signers, args.rounds)
        verified_rates.append(1e6 / us["verify only"])
        print(f"\n{tokens} tokens per completion, {len(groups)} groups of ~{size / 1024:.1f} KiB")
        print("  microseconds per group:")
        for name, value in us.items():
            print(f"  {name:18s} {value:8.1f}")
        print(f"  sign / serialize               {us['sign'] / us['serialize']:6.2f} x")
        print(f"  arrival signed / unsigned      {us['arrival, signed'] / us['arrival, unsigned']:6.2f} x")
        print(f"  verification throughput        {1e6 / us['verify only']:8.0f} groups/s on one core")
    worst = min(verified_rates)
    verdict = "PASS" if worst >= TARGET_GROUPS_PER_S else "FAIL"
    target = f"{TARGET_GROUPS_PER_S:.0f} (1,000 nodes x 8 groups / 10 s)"
    print(f"\n{verdict}: {worst:.0f} verified groups/s on one core, target >= {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
