"""The network: flows sharing link bandwidth on the cluster graph (sim.network.flow), the
collective library's algorithms decomposed into flows (sim.network.collectives) and nccl-tests'
conventions (sim.network.nccl_tests)."""

from sim.network.flow import NETWORK_MODES, FlowNetwork, TransferResult, max_min_rates

__all__ = ["NETWORK_MODES", "FlowNetwork", "TransferResult", "max_min_rates"]
