"""Plan a cluster (issue #17): from a simulated step to the time and cost of a whole training run
with failures, checkpoints and restarts.

- sim.plan.goodput: the closed form (exact expected wall time and goodput of the run under
  Poisson failures; Young 1974 / Daly 2006 checkpoint intervals);
- sim.plan.montecarlo: a seeded SimPy Monte Carlo of the same run with failure injection;
- sim.plan.training_run: the model's inputs from a scenario (checkpoint size from the memory
  model, storage and PCIe bandwidths from the topology, failure rate, restart time);
- sim.plan.planner: `sim5d plan` (candidates, the best layout of each by the sweep, table, JSON,
  chart).
"""
