"""Activation kernels: the gated activations act(gate) * up of DeepSeek's MLPs and experts."""
