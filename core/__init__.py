"""modelcall.core: the microkernel — hook specs, plugin host, stage contracts, request state and the Kernel."""
import sys

from modelcall.core.tools import server as _server, support as _support, typed as _typed

# NOTE: the module paths from before core/tools/ still import, for plugins written against them: once
# a parent package has run, the import system returns a submodule it finds in sys.modules. Set before
# the kernel's import below, which still names one of them.
for _old, _new in (("server_tools", _server), ("tooling", _support), ("typed_tools", _typed)):
    sys.modules[f"{__name__}.{_old}"] = _new
    globals()[_old] = _new

from modelcall.core.config import KernelConfig
from modelcall.core.errors import (
    ConfigError, ContextOverflow, InvalidRequest, ModelcallError, ModelNotFound, Overloaded, PluginError,
    Unavailable,
)
from modelcall.core.handle import Completion, RequestHandle
from modelcall.core.hookspecs import hookimpl, hookspec
from modelcall.core.host import PluginHost
from modelcall.core.kernel import Kernel
from modelcall.core.params import SamplingParams
from modelcall.core.pooling import Pooler, PoolingParams, PoolingPlan
from modelcall.core.plan import ModelSpec, ScheduledChunk, SchedulePlan, StepOutput
from modelcall.core.policies import EvictionPolicy, KeyedWaitingQueue, NewcomerTerms, WaitingQueue
from modelcall.core.request import Request, Status
from modelcall.core.submit import GenerateRequest

__version__ = "0.1.0"

__all__ = [
    "Completion", "ConfigError", "ContextOverflow", "EvictionPolicy", "GenerateRequest", "InvalidRequest", "Kernel",
    "KernelConfig", "KeyedWaitingQueue", "ModelNotFound", "ModelSpec", "ModelcallError", "NewcomerTerms", "Overloaded",
    "PluginError", "PluginHost", "Pooler", "PoolingParams", "PoolingPlan",
    "Request", "RequestHandle", "SamplingParams", "ScheduledChunk", "SchedulePlan", "Status", "StepOutput",
    "Unavailable", "WaitingQueue", "__version__", "hookimpl", "hookspec",
]
