"""The scheduler's view of a testbed file: its topology and its timing model."""

from __future__ import annotations

from oddl.common.config import TestbedConfig
from oddl.common.errors import ConfigError
from oddl.controller.scheduling import Grid, NodeSpec, TimingModel, Topology, WssSpec


def topology_from_config(cfg: TestbedConfig) -> Topology:
    """The scheduler's view of a testbed file; ConfigError for hosts it cannot schedule."""
    switched = [n.id for n in cfg.nodes if not n.on_wss]
    if switched:
        raise ConfigError(
            f"{cfg.path}: host(s) {', '.join(switched)} have only circuit-switch ports; this "
            "controller schedules jobs on hosts with a tunable transmitter on a WSS, so it "
            "cannot run this testbed yet (`oddl config check` validates it); give the hosts "
            "a transmitter on a WSS to run jobs")
    grid = Grid(cfg.grid.first_thz, cfg.grid.spacing_ghz, cfg.grid.channels)
    nodes = tuple(NodeSpec(n.id, n.transmitter, n.rx_channel, cfg.attachment(n.id).wss,
                           cfg.attachment(n.id).out_port) for n in cfg.nodes)
    wss = tuple(WssSpec(d.id, d.ports) for d in cfg.devices_of("wss"))
    return Topology(grid=grid, nodes=nodes, wss=wss)


def timing_from_config(cfg: TestbedConfig) -> TimingModel:
    """The scheduler's timing model from the [timing] and [fabric] tables."""
    t = cfg.timing
    return TimingModel(tune_s=t.laser_tune_ms / 1e3, skew_s=t.clock_skew_us / 1e6,
                       cdr_s=t.cdr_lock_us / 1e6, command_s=t.command_ms / 1e3,
                       wss_settle_s=t.wss_settle_ms / 1e3, slot_margin_s=t.slot_margin_us / 1e6,
                       line_rate_bps=cfg.fabric.line_rate_gbps * 1e9)
