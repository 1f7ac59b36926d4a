"""Sampling parameters reject bad values with errors that name the field."""
import pytest

from modelcall.core import InvalidRequest, KernelConfig, SamplingParams
from modelcall.core.errors import ConfigError


@pytest.mark.parametrize("fields, field", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0.0}, "top_p"),
    ({"temperature": -0.1}, "temperature"),
    ({"min_p": 2}, "min_p"),
    ({"top_k": -5}, "top_k"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"logprobs": 50}, "logprobs"),
    ({"stop": [""]}, "stop"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_bad_sampling_parameters_raise_invalid_request_naming_the_field(fields, field):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams.create(**fields)
    assert e.value.field == field
    assert field in str(e.value)
    assert e.value.status == 400


def test_loose_input_is_normalised():
    p = SamplingParams.create(stop="###", stop_token_ids=7, max_tokens=4, temperature=0)
    assert p.stop == ("###",) and p.stop_token_ids == (7,) and p.greedy


def test_kernel_config_rejects_nonsense():
    with pytest.raises(ConfigError, match="block_size"):
        KernelConfig(block_size=12)
    with pytest.raises(ConfigError, match="dtype"):
        KernelConfig(dtype="int3")
    assert KernelConfig(scheduler="auto").wants("scheduler", "anything")
    assert not KernelConfig(scheduler="fair").wants("scheduler", "default")
