"""A consumer process for the re-delivery test: applies each group once (keyed by group id), logs
every delivery, and SIGKILLs itself right after processing record number `kill_after` (0-based),
before the loop can store that record's offset.

usage: python -m tests.integration.idempotent_consumer BOOTSTRAP TOPIC SINK KILL_AFTER EXPECTED
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from sapo import wire
from sapo.kafka import Disposition, Record
from sapo.v1 import rollout_pb2
from tests.integration.kafka_helpers import make_loop


def main(bootstrap: str, topic: str, sink: Path, kill_after: int, expected: int) -> None:
    applied = (
        {json.loads(line)["group_id"] for line in sink.read_text().splitlines()} if sink.exists() else set()
    )
    count = 0

    def handle(record: Record) -> Disposition:
        nonlocal count
        group = wire.decode(rollout_pb2.RolloutGroup, record.value, 1 << 20)
        fresh = group.group_id not in applied
        applied.add(group.group_id)
        with sink.open("a") as out:
            out.write(json.dumps({"group_id": group.group_id, "applied": fresh}) + "\n")
        if count == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        count += 1
        return Disposition.DONE

    loop, _, _ = make_loop(bootstrap, f"{topic}.group", [topic], handle)
    # The killed member stays in the group until its session times out (6 s), so wait longer.
    loop.run(until=lambda: len(applied) >= expected, idle_timeout_s=30)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
