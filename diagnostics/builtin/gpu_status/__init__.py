"""gpu-status on the client: its per-GPU view, the fleet grid, the remembered nvidia-smi fields."""
