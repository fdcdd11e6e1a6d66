"""`sapo conformance`: a kit that drives a running generator, sampler or trainer through the contract
written down in docs/contract.md and reports, check by check, where it conforms.

- `results`: verdicts and the pass/fail table, each check citing its contract section.
- `observe`: reading the service's topics and its consumer groups' committed offsets from outside.
- `material`: real questions with right and wrong answers, and the messages built from them.
- `common`: the service under test, sending, and the checks all three answer alike.
- `generator`, `sampler`, `trainer`: one scenario per service (the kit plays its neighbours).
- `cli`: the command.
"""
