"""The runner's name for the shared C-build helper (modelcall.plugins.cbuild), kept so cpu_kernel's import holds."""
from modelcall.plugins.cbuild import FLAGS, OnceLibrary, cache_dir, compile_library

__all__ = ["FLAGS", "OnceLibrary", "cache_dir", "compile_library"]
