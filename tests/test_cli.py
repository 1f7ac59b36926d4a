"""The `modelcall` command line: subcommands from plugins, one-line errors with exit 2, streaming generate."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from modelcall.events import Finished, TokensEmitted, from_json
from modelcall.plugins.cli.main import main

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
SMALL = ["--num-kv-blocks", "64", "--threads", "1"]


def modelcall(*args: str, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "import sys; from modelcall.plugins.cli.main import main; sys.exit(main())", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=ENV)


def _one_line_error(err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("modelcall: error: "), err
    assert "Traceback" not in err


def test_no_subcommand_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: modelcall" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "hi", "--max-tokens", "0"], "max_tokens"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "--prompt", "hi", "--block-size", "3"], "block_size"),
    (["generate", "--prompt", "hi", "--stage", "bogus=x"], "--stage"),
    (["generate", "--prompt", "hi", "--plugin-config", "x={not json"], "not JSON"),
    (["generate", "--prompt", "hi", "--system", "be nice"], "--system needs --chat"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_2_before_loading_a_model(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    _one_line_error(err)
    assert message in err


@pytest.mark.parametrize("argv", [["generate"], ["generate", "--prompt", "x", "--max-tokens", "many"],
                                  ["nonexistent-command"]])
def test_argument_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_a_missing_model_directory_is_a_one_line_error_in_a_real_process(tmp_path):
    r = modelcall("generate", "--model", str(tmp_path / "nope"), "--prompt", "hi")
    assert r.returncode == 2
    _one_line_error(r.stderr)
    assert "nope" in r.stderr


def test_demo_model_writes_a_model_directory_and_refuses_a_non_empty_one(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo-model", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    assert main(["demo-model", str(out)]) == 2
    _one_line_error(capsys.readouterr().err)


PLUGIN = '''
    from modelcall.core import hookimpl

    def configure(parser):
        parser.add_argument("--name", default="world")

    async def run(args):
        print(f"hello {args.name} plugins={args.plugins}")
        return 3

    @hookimpl
    def register_commands(register):
        register("hello", "say hello", configure, run)
'''


def test_plugins_add_subcommands_and_can_be_blocked(tmp_path, monkeypatch, capsys):
    (tmp_path / "mc_hello_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--plugin", "mc_hello_plugin", "hello", "--name", "you"]) == 3
    assert capsys.readouterr().out == "hello you plugins=['mc_hello_plugin']\n"
    with pytest.raises(SystemExit):
        main(["--plugin", "mc_hello_plugin", "-p", "no:mc_hello_plugin", "hello"])
    assert "invalid choice: 'hello'" in capsys.readouterr().err


def test_kernel_options_become_the_kernel_config():
    import argparse

    from modelcall.core.commands import add_kernel_options, kernel_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    args = parser.parse_args(["--max-model-len", "512", "--kv-cache-gb", "0.25", "--no-prefix-caching",
                              "--stage", "sampler=mine", "--plugin-config", 'x={"a": 1}'])
    args.plugins, args.blocked = ["some.module"], ["no:other"]
    kernel = kernel_from_args(args, max_num_seqs=8)
    cfg = kernel.config
    assert (cfg.max_model_len, cfg.kv_cache_memory_gb, cfg.enable_prefix_caching) == (512, 0.25, False)
    assert (cfg.sampler, cfg.plugin_config, cfg.max_num_seqs, cfg.block_size) == ("mine", {"x": {"a": 1}}, 8, 16)
    assert kernel._plugin_args[:2] == (("some.module",), ("no:other",))


def test_generate_streams_text_and_json_events(demo_model_dir, capsys):
    args = ["generate", "--model", demo_model_dir, "--prompt", "def main():", "--max-tokens", "12",
            "--temperature", "0", *SMALL]
    r = modelcall(*args, "--json")  # a real process, as a user runs it
    assert r.returncode == 0, r.stderr
    events = [from_json(line) for line in r.stdout.splitlines()]
    deltas = [e for e in events if type(e) is TokensEmitted]
    assert type(events[-1]) is Finished and events[-1].reason == "length"
    assert events[-1].usage.completion_tokens == 12 == sum(len(d.token_ids) for d in deltas)
    text = "".join(d.text for d in deltas)
    assert text == events[-1].text and text.strip()
    assert main(args) == 0  # greedy: the same text again, streamed as plain text
    assert capsys.readouterr().out == text + "\n"
