"""In-cluster entrypoints: the Ray Tune over Ray Train V2 code each RayJob runs (`python -m training_entrypoints.sweep`)."""
