"""The server's services, built once by `create_app` and handed to what needs them.

`Services` holds every long-lived part of a server: its settings, the pool registry, the stream
hub, the recordings, the housekeeper, the routing runs, the fleets and the metrics. Routes get
the part they need through the dependencies of app/deps.py (`RegistryDep`, `FleetsDep`, ...);
the lifespan, the routing runs and the pages are given the object itself. `app.state` carries
only `services`, read in the app factory, the dependencies and the HTTP layer.

`Startup` is what a command line asks the server to hold when it starts, passed to `create_app`
as an argument: `pools` (a list of (spec, options) for `app.mirrors.start_pool`; None: the
default pool), `fleets` (a list of (name, engines, options) for `Fleets.create`) and
`router_runs` (router runs someone else started, for `RoutingRuns.adopt`: the demo's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fleets import Fleets
from .housekeeping import Housekeeper
from .instance import Instance
from .metrics import Metrics
from .recordings import Recordings
from .registry import Registry
from .routing_jobs import RoutingRuns
from .settings import Settings
from .stream import Hub


@dataclass
class Startup:
    """What the server holds once it has started (see the module docstring)."""

    pools: list[tuple[dict, dict]] | None = None
    fleets: list[tuple[str, list[dict], dict]] = field(default_factory=list)
    # (session, spec, fleet, load) of router runs started outside, listed while they run (the demo)
    router_runs: list[tuple] = field(default_factory=list)


@dataclass
class Services:
    settings: Settings
    instance: Instance
    registry: Registry
    hub: Hub
    recordings: Recordings
    housekeeper: Housekeeper
    routing_runs: RoutingRuns
    fleets: Fleets
    metrics: Metrics
    startup: Startup

    @classmethod
    def build(cls, settings: Settings, startup: Startup | None = None) -> Services:
        instance = Instance.new()
        registry = Registry(settings)
        fleets = Fleets()
        fleets.nats_auth = settings.nats_auth
        return cls(settings=settings, instance=instance, registry=registry,
                   hub=Hub(settings.stream_interval_s, instance, settings),
                   recordings=Recordings(settings.recordings_dir, registry, settings.max_blocks),
                   housekeeper=Housekeeper(registry), routing_runs=RoutingRuns(), fleets=fleets,
                   metrics=Metrics(registry, fleets), startup=startup or Startup())
