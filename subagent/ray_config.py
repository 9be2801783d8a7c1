"""`RayConfig` as the face hands it out: each Ray host composes this package's `Runtime`.

`providers.ray` sits below the runtime wiring in the layers, so it cannot name `Runtime`; the
face supplies it as the default `runtime_factory`. Importing this module does not import Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

from providers.ray import RayConfig as _ProviderRayConfig
from providers.ray_runtime import RuntimeFactory
from subagent.runtime import Runtime

__all__ = ["RayConfig"]


@dataclass(frozen=True)
class RayConfig(_ProviderRayConfig):
    """How `RayProvider` reaches Ray and builds its hosts; see `providers.ray.RayConfig`.

    `runtime_factory` defaults to `subagent.Runtime`, called as `Runtime(store=SessionStore)`
    on every host.
    """

    runtime_factory: RuntimeFactory | None = Runtime
