"""The rollout kernel: one pure answer to "which nodes of a NodeWright start now, which
admissions go, and why does every other node and compartment wait".

The scheduler acts on it, the status service shows it and ``nodewright plan`` simulates
with it, so what NodeWright does and what it says cannot drift apart (docs/rollouts.md):

- :mod:`shared.rollout.rules`: budgets in nodes, compartments and their assignment,
  strategies' batch sizes, maintenance windows, priority and sequencing, reset flags;
- :mod:`shared.rollout.book`: the scheduler's persisted batch state (the batch book);
- :mod:`shared.rollout.slots`: which nodes hold a budget slot, and why;
- :mod:`shared.rollout.kernel`: one NodeWright's decision, its phases (reset, account, open,
  admit, explain) in :mod:`shared.rollout.phases`, what they read in :mod:`shared.rollout.view`
  and what they return in :mod:`shared.rollout.plans`;
- :mod:`shared.rollout.fleet`: the whole-cluster inputs (every NodeWright, policy, node and
  the scheduler's settings) turned into one decision: shared budgets and priority included;
- :mod:`shared.rollout.simulation`: the batches a rollout will run, for ``nodewright plan``.

Everything here is pure (no I/O, no clock: ``now`` is passed in; import-linter keeps the
clients out). Writing admissions and the batch book is the scheduler's shell's job; showing
the reasons is the status service's.
"""
