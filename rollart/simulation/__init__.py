"""Simulated compute: an engine and a trainer that spend time by a stated cost model (see
rollart.config.SimulationConfig) so that system figures can be measured on one CPU host."""
