"""`modelcall serve --replicas N` gets its replicated kernel through the `provide_replicated_kernel`
hook (the front end imports no other plugin for it): the built-in scale plugin answers, an installed
plugin answers first, and with none the option is refused with what to install."""
from __future__ import annotations

import argparse
import logging

import pytest
from keys_util import write_keys

from modelcall.core import hookimpl
from modelcall.plugins.http import serve


def _serve_args(*argv: str, plugins: tuple = (), blocked: tuple = ()) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="modelcall")
    parser.add_argument("-p", dest="blocked", action="append", default=[])
    sub = parser.add_subparsers(dest="command")
    serve.configure(sub.add_parser("serve"))
    args = parser.parse_args([*(a for name in blocked for a in ("-p", name)), "serve", *argv])
    args.plugins = list(plugins)
    return args


def test_replicas_come_from_the_scale_plugin_with_the_serve_options():
    kernel = serve._kernel_from_args(_serve_args("--replicas", "3", "--max-num-seqs", "5"))
    assert type(kernel).__name__ == "RemoteKernel" and type(kernel).__module__ == "modelcall.plugins.scale.remote"
    assert kernel.num_replicas == 3 and kernel.ray_address is None
    assert kernel.config.max_num_seqs == 5  # the replicas get the configuration the options built


class _OwnReplicas:
    """An installed plugin that serves replicas its own way (asked before the trylast built-in)."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, str | None]] = []

    @hookimpl
    def provide_replicated_kernel(self, config, num_replicas, ray_address):
        self.asked.append((num_replicas, ray_address))
        return ("own", config.max_num_seqs)


def test_an_installed_plugin_provides_the_replicas_first():
    own = _OwnReplicas()
    got = serve._kernel_from_args(_serve_args("--replicas", "2", "--ray-address", "ray://h:1", "--max-num-seqs", "7",
                                              plugins=(own,)))
    assert got == ("own", 7) and own.asked == [(2, "ray://h:1")]


def test_without_a_provider_replicas_are_refused_naming_the_extra():
    with pytest.raises(SystemExit, match=r"modelcall\[scale\]"):
        serve._kernel_from_args(_serve_args("--replicas", "2", blocked=("no:scale",)))


def test_no_replicas_is_a_plain_kernel():
    from modelcall.core import Kernel
    assert type(serve._kernel_from_args(_serve_args())) is Kernel


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_a_replica_count_under_one_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as e:
        _serve_args("--replicas", bad)
    assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_replicas_with_keys_and_no_quota_store_warn_that_each_replica_counts_alone(tmp_path, caplog):
    keys = str(write_keys(tmp_path / "keys.toml", {"mc-replica-key": {"name": "k", "rpm": 5}}))
    with caplog.at_level(logging.WARNING, logger="modelcall.http"):
        serve._kernel_from_args(_serve_args("--replicas", "3", "--api-keys", keys))
    assert "--replicas 3 without --quota-store" in caplog.text and "up to 3 times its limits" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modelcall.http"):
        kernel = serve._kernel_from_args(_serve_args("--replicas", "3", "--api-keys", keys,
                                                     "--quota-store", "redis://127.0.0.1:6399/0"))
        serve._kernel_from_args(_serve_args("--replicas", "3"))   # no keys: no quotas to share
    assert "--quota-store" not in caplog.text
    assert kernel.config.plugin_config["auth"]["quota_store"] == "redis://127.0.0.1:6399/0"   # what each replica gets
