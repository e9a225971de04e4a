"""The scheduler's view of a testbed file: its topology and its timing model."""

from __future__ import annotations

from oddl.common.config import TestbedConfig
from oddl.controller.scheduling import Grid, NodeSpec, TimingModel, Topology, WssSpec


def topology_from_config(cfg: TestbedConfig) -> Topology:
    """The TT-FR scheduler's view of a testbed file: its hosts on a WSS (hosts whose ports go
    to a circuit switch run on standing light paths, `oddl.controller.circuits`)."""
    grid = Grid(cfg.grid.first_thz, cfg.grid.spacing_ghz, cfg.grid.channels)
    nodes = tuple(NodeSpec(n.id, n.transmitter, n.rx_channel, cfg.attachment(n.id).wss,
                           cfg.attachment(n.id).out_port) for n in cfg.nodes if n.on_wss)
    wss = tuple(WssSpec(d.id, d.ports) for d in cfg.devices_of("wss"))
    return Topology(grid=grid, nodes=nodes, wss=wss)


def timing_from_config(cfg: TestbedConfig) -> TimingModel:
    """The scheduler's timing model from the [timing] and [fabric] tables."""
    t = cfg.timing
    return TimingModel(tune_s=t.laser_tune_ms / 1e3, skew_s=t.clock_skew_us / 1e6,
                       cdr_s=t.cdr_lock_us / 1e6, command_s=t.command_ms / 1e3,
                       wss_settle_s=t.wss_settle_ms / 1e3, slot_margin_s=t.slot_margin_us / 1e6,
                       line_rate_bps=cfg.fabric.line_rate_gbps * 1e9)
