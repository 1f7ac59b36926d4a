"""Moved to `modelcall.core.commands` (the command toolkit is a core seam). This alias keeps commands
written against the old path working."""
from modelcall.core.commands import (  # noqa: F401
    STAGES, CommandError, add_kernel_options, config_from_args, kernel_from_args, wait_ready,
)
