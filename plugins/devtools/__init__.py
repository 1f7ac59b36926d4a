"""Tools for plugin authors: `modelcall plugins [--json]`, `GET /-/plugins` and the hook reference."""
