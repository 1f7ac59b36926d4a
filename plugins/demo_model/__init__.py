"""The built-in demo model: a tiny random-weight Llama built locally, so modelcall runs with no download.

    from modelcall.plugins.demo_model import demo_model_dir
    path = demo_model_dir()      # built once into the user cache, reused after

`MODELCALL_CACHE_DIR` overrides the cache root (default: platformdirs' user cache for "modelcall").
"""
from modelcall.plugins.demo_model.cache import build_demo_model, cache_root, demo_model_dir
from modelcall.plugins.demo_model.build import BUILDER_VERSION

__all__ = ["BUILDER_VERSION", "build_demo_model", "cache_root", "demo_model_dir"]
