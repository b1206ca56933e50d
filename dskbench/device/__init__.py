"""The machine a run plans for and runs on: the device it detects (DeviceInfo) and the GPUs CUDA may use
(CUDA_VISIBLE_DEVICES). Below every pipeline stage, so gating, the engine and the timers all read it
without importing one another."""
