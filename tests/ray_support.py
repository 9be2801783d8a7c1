"""A local Ray cluster and the provider over it, shared by the Ray test modules (each module
starts one, with its own host set-up)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from providers.ray import RayProvider
from subagent.ray_config import RayConfig
from subagent.runtime import Runtime


def ray_provider(
    shared_dir: Path, host_setup: Callable[[Runtime], None], pool_size: int
) -> Iterator[RayProvider]:
    """A connected `RayProvider` on a two-CPU local cluster, closed after the `yield`.

    `ray.init` runs on the provider's driver thread, host creation in the hub's thread pool:
    the hub keeps running while the local cluster starts."""
    config = RayConfig(
        store_dir=str(shared_dir),
        pool_size=pool_size,
        host_setup=host_setup,
        host_num_cpus=0.5,
        init_options={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False},
    )
    provider = RayProvider(config)
    provider.connect()
    yield provider
    provider.close()
