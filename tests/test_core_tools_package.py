"""core/tools/ is one package for the tool contracts: every public name of its stage modules is exported by
the package, and the module paths from before the package (core/typed_tools.py, core/server_tools.py,
core/tooling.py) still import the same objects, so plugins written against them keep working."""
from __future__ import annotations

import inspect

from modelcall.core import tools
from modelcall.core.tools import parser, server, support, typed


def _public(module) -> set[str]:
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value) or name == "annotations":
            continue
        if getattr(value, "__module__", module.__name__) == module.__name__ or name.isupper():
            names.add(name)
    return names


def test_the_package_exports_every_public_name_of_its_contract_modules():
    for module in (parser, server, typed):
        names = _public(module)
        assert names, module.__name__
        assert names <= set(tools.__all__), (module.__name__, sorted(names - set(tools.__all__)))
        for name in names:
            assert getattr(tools, name) is getattr(module, name), name


def test_the_module_paths_from_before_the_package_import_the_same_objects():
    import modelcall.core.server_tools as old_server
    import modelcall.core.typed_tools
    from modelcall.core.tooling import ToolSupport
    from modelcall.core.typed_tools import Tool, tool

    assert old_server is server and modelcall.core.typed_tools is typed
    assert Tool is tools.Tool and tool is tools.tool and ToolSupport is support.ToolSupport
