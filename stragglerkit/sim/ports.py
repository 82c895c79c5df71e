"""The ports a flow uses in the simulator: per-GPU NICs, and NVLink inside a server.

Port ``r`` is rank r's transmit NIC, ``n + r`` its receive NIC; with servers of ``g > 1`` GPUs,
``2n + r`` and ``3n + r`` are its NVLink transmit and receive ports, used by messages whose two
ranks share a server (see :mod:`stragglerkit.sim.simulator` for the model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from stragglerkit.sim.graph import FloatArray, IntArray

if TYPE_CHECKING:
    from stragglerkit.sim.network import Network

__all__ = ["Ports", "ports_shared"]


class Ports:
    """The two ports (transmit, receive) each message uses, and every port's bandwidth.

    Port ``r`` is rank r's transmit NIC, ``n + r`` its receive NIC; with servers (``g > 1``)
    ``2n + r`` and ``3n + r`` are its NVLink transmit and receive ports, used by messages whose two
    ranks share a server.
    """

    __slots__ = ("capacity", "count", "rx", "tx")

    def __init__(self, network: Network, src: IntArray, dst: IntArray) -> None:
        n, g = network.world_size, network.gpus_per_server
        nic = np.concatenate([np.asarray(network.tx_bandwidth), np.asarray(network.rx_bandwidth)]).astype(np.float64)
        self.tx, self.rx = src, dst + n
        if g == 1:
            self.capacity = nic
        else:
            self.capacity = np.concatenate([nic, np.full(2 * n, network.nvlink_rate)])
            intra = (src // g) == (dst // g)
            self.tx = src + 2 * n * intra
            self.rx = self.rx + 2 * n * intra
        self.count = self.capacity.size

    def path_bandwidth(self) -> FloatArray:
        """Per message: the rate it gets alone, ``min(transmit port, receive port)``."""
        return np.minimum(self.capacity[self.tx], self.capacity[self.rx])


def ports_shared(tx: IntArray, rx: IntArray, start: FloatArray, end: FloatArray, nbytes: FloatArray) -> bool:
    """Do two flows with bytes overlap in time on one port (NIC or NVLink direction)?"""
    live = (nbytes > 0) & np.isfinite(end)
    if not live.any():
        return False
    start, end = start[live], end[live]
    tol = 1e-9 * max(float(end.max()), 1e-12)
    for nic in (tx[live], rx[live]):
        order = np.lexsort((start, nic))
        same = nic[order][1:] == nic[order][:-1]
        if np.any(same & (start[order][1:] < end[order][:-1] - tol)):
            return True
    return False
