"""Start (or join) a Ray cluster and deploy N kernel replicas with the prefix-aware router."""
from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("modelcall.scale")

APP = "modelcall"
DEPLOYMENT = "KernelReplica"


class ScaleMissing(RuntimeError):
    pass


def import_serve() -> Any:
    try:
        from ray import serve
    except ImportError as e:
        raise ScaleMissing("--replicas needs Ray Serve: pip install 'modelcall[scale]'") from e
    return serve


def start_cluster(address: str | None, num_cpus: int | None = None, temp_dir: str | None = None) -> None:
    """Join `address` (a running cluster, 'auto' for the local one) or start a small local one."""
    import ray

    if ray.is_initialized():
        return
    # NOTE: Ray's core worker in this (driver) process installs abseil's failure signal handler over
    # SIGTERM, which aborts the process instead of letting `modelcall serve` drain.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
           **{k: v for k, v in os.environ.items() if k.startswith("MODELCALL_")}}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env}, logging_level=logging.WARNING)
        return
    # NOTE: a local cluster keeps its sessions under RAY_TMPDIR (default /tmp/ray; unix socket paths
    # are limited to ~107 bytes, keep it short) and a small object store: only event bytes cross it.
    extra = {"_temp_dir": temp_dir} if temp_dir else {}
    ray.init(num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False,
             object_store_memory=80 * 2**20, runtime_env={"env_vars": env}, logging_level=logging.WARNING,
             configure_logging=False, **extra)


def deploy(config: dict[str, Any], plugins: list[str], blocked: list[str], num_replicas: int, *,
           max_ongoing_requests: int = 64, imbalance_threshold: int = 4, match_rate_threshold: float = 0.1,
           health_check_period_s: float = 2.0) -> Any:
    """Run the replicas' application and return its DeploymentHandle."""
    serve = import_serve()
    from ray.serve.config import RequestRouterConfig

    from modelcall.plugins.scale.replica import KernelReplica
    from modelcall.plugins.scale.router import PrefixAwareRouter

    serve.start(proxy_location="Disabled")
    dep = serve.deployment(
        KernelReplica, name=DEPLOYMENT, num_replicas=num_replicas, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},  # NOTE: the kernel's own threads do the work; 0 lets N fit anywhere
        health_check_period_s=health_check_period_s, health_check_timeout_s=30, graceful_shutdown_timeout_s=30,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAwareRouter,
            request_router_kwargs={"imbalance_threshold": imbalance_threshold,
                                   "match_rate_threshold": match_rate_threshold},
            request_routing_stats_period_s=1.0),
    )
    return serve.run(dep.bind(config, plugins, blocked), name=APP, route_prefix=None, blocking=False)


def replica_ids() -> list[str]:
    """Unique ids of the live replicas (their actors are named SERVE_REPLICA::app#deployment#id)."""
    import ray

    out = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        name = a["name"] if isinstance(a, dict) else a
        if name.startswith(f"SERVE_REPLICA::{APP}#{DEPLOYMENT}#"):
            out.append(name.rsplit("#", 1)[1])
    return out


def shutdown() -> None:
    import ray

    if not ray.is_initialized():  # NOTE: serve.shutdown() would start a new local cluster to shut down
        return
    try:
        import_serve().shutdown()
    finally:
        ray.shutdown()
