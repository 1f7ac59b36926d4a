"""Replicas past one machine: kernel replicas on Ray Serve behind the same HTTP front end, routed by
the prefix blocks they hold (docs/scale.md). Needs the `scale` extra (ray[serve])."""
