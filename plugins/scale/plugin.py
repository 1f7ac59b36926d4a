"""The scale plugin's seam into the front end: `modelcall serve --replicas N` asks for a replicated
kernel through `provide_replicated_kernel`, and this answers with a RemoteKernel on Ray Serve.
Ray is imported only when replicas are asked for, so the plugin costs nothing to load."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl(trylast=True)
def provide_replicated_kernel(config: Any, plugins: Any, blocked: Any, num_replicas: int,
                              ray_address: Any) -> Any:
    from modelcall.plugins.scale.remote import RemoteKernel  # imports ray's client pieces lazily

    return RemoteKernel(config, plugins=tuple(plugins), blocked=tuple(blocked), num_replicas=num_replicas,
                        ray_address=ray_address)
