"""The built-in demo models, built or shipped locally, so modelcall runs with no download.

    from modelcall.plugins.demo_model import demo_model_dir, trained_model_dir
    path = trained_model_dir()   # the model that answers (trained here, committed in the package)
    path = demo_model_dir()      # the tiny random-weight model: built once into the user cache

`MODELCALL_CACHE_DIR` overrides the cache root (default: platformdirs' user cache for "modelcall").
The trained one is the default model; `MODELCALL_DEMO_MODEL=random` makes the random one the default
instead (the test suite and the benchmarks do: see plugin.py).
The trained model's tools: `modelcall.plugins.demo_model.tools` (`calculator`, `get_weather`).
"""
from modelcall.plugins.demo_model.cache import build_demo_model, cache_root, demo_model_dir
from modelcall.plugins.demo_model.build import BUILDER_VERSION
from modelcall.plugins.demo_model.trained_dir import copy_trained_model, trained_model_dir

__all__ = ["BUILDER_VERSION", "build_demo_model", "cache_root", "copy_trained_model", "demo_model_dir",
           "trained_model_dir"]
