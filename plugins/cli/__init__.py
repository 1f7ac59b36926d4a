"""The `modelcall` command line: built-in subcommands plus those plugins add through `register_commands`.

Subcommands written in other plugins reuse `modelcall.core.commands` for the kernel's
options (`add_kernel_options`, `kernel_from_args`) and raise `CommandError` for user errors.
"""
