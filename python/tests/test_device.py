"""device= in Python (docs/cuda.md): the CPU works; a CUDA device is refused with one RuntimeError that
names it and the reason (no CUDA backend in this build, no driver, no GPU, or the models not running on
CUDA yet); a malformed name is a ValueError."""

import pytest

import loom

CONFIG = {"arch": "llama", "vocab_size": 32, "context_length": 8, "d_model": 16, "num_layers": 1, "num_heads": 2,
          "d_ff": 32}


def test_cpu_is_accepted_everywhere():
    assert loom.check_device("cpu") == "cpu"
    assert loom.Model.from_config(CONFIG, device="cpu").arch == "llama"
    loom.TransformerLM(32, 8, 16, 1, 2, 32, device="cpu")


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_is_refused_with_the_reason(device):
    if loom.cuda_available():
        pytest.skip("a GPU is present: the refusal then says the models do not run on CUDA yet")
    assert loom.cuda_device_count() == 0
    for make in (lambda: loom.Model.from_config(CONFIG, device=device),
                 lambda: loom.TransformerLM(32, 8, 16, 1, 2, 32, device=device),
                 lambda: loom.check_device(device, "Model")):
        with pytest.raises(RuntimeError) as e:
            make()
        message = str(e.value)
        name = device if ":" in device else "cuda:0"
        assert f"cannot use {name}" in message, message
        # One of the two reasons the runtime gives without a GPU (src/backends/cuda/runtime.cpp, stub/).
        assert "no usable CUDA GPU" in message or "built without the CUDA backend" in message, message


def test_malformed_devices_are_value_errors():
    for bad in ("gpu", "cuda:", "cuda:x", "tpu!"):
        with pytest.raises(ValueError):
            loom.check_device(bad)
    with pytest.raises(RuntimeError, match="Apple"):
        loom.check_device("mps")
