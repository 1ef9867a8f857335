"""The roofline cost model of simulated compute, in simulated seconds.

A generation step of a continuous-batching engine reads the weights once and every running
request's KV cache, and computes every token it processes (one per decoding request, a chunk per
prefilling one): it lasts as long as the slower of the two. Training costs 6 x params FLOPs per
token; weights move at a link's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollart.config import Hardware, SimulationConfig


@dataclass(frozen=True)
class CostModel:
    sim: SimulationConfig
    hardware: Hardware

    @property
    def weight_bytes(self) -> float:
        return self.sim.params_b * 1e9 * self.sim.bytes_per_param

    def _flops_s(self) -> float:
        return self.hardware.dense_tflops * 1e12 * self.sim.compute_efficiency

    def _bytes_s(self) -> float:
        return self.hardware.memory_tb_s * 1e12 * self.sim.bandwidth_efficiency

    def step_s(self, tokens: float, context_tokens: float) -> float:
        """One engine step processing `tokens` (prefill chunks plus one per decoding request)
        over requests holding `context_tokens` of KV cache in all."""
        compute = tokens * 2 * self.sim.params_b * 1e9 / self._flops_s()
        kv_bytes = context_tokens * self.sim.kv_bytes_per_token
        memory = (self.weight_bytes + kv_bytes) / self._bytes_s()
        return max(compute, memory)

    def train_s(self, tokens: float) -> float:
        train = self.sim.hardware[self.sim.train_hardware]
        flops = train.dense_tflops * 1e12 * self.sim.train_efficiency * self.sim.train_gpus
        return self.sim.train_fixed_s + tokens * 6 * self.sim.params_b * 1e9 / flops

    def transfer_s(self) -> float:
        """Push (trainer to store) or pull (store to replica) of one version."""
        return self.weight_bytes / (self.sim.weight_link_gb_s * 1e9)

    def load_s(self) -> float:
        """A suspended replica loading a pulled version into GPU memory."""
        return self.weight_bytes / (self.sim.weight_load_gb_s * 1e9)


def train_cost(sim: SimulationConfig) -> CostModel:
    return CostModel(sim, sim.hardware[sim.train_hardware])
