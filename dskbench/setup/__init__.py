"""Set-up: the pinned GPU stack check, the main job's steps, the JIT caches."""
