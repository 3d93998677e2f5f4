"""On PYTHONPATH, torch reports one CUDA GPU, as a 1-GPU machine does: for the bad-input case
of more ranks than GPUs (tests/test_bad_input.py), refused before anything touches a device.
Only what torch says is changed; NVML still sees no GPU."""

import torch

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
