"""RoPE kernels: DeepSeek's interleaved rope on q_pe / k_pe, alone or fused with FP8 quantising."""
